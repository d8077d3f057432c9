"""corelens inside other tools, each behind an optional extra: kvpress (`kvpress`), lmms-eval (`lmms_eval`)."""
