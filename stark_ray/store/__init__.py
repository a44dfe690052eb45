"""Results on disk: Parquet part files written atomically, read back with DuckDB."""
