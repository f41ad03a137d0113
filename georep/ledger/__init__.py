"""The delivery ledger: the Parquet writer and its schema."""
