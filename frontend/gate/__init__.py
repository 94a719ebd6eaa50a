"""The gate's records and judgement: security analysis of definitions, pins, the activity log, the state store."""
