"""Data: trajectory stores (Parquet + PNG), privacy masking before storage, collection, the privacy audit,
the AndroidControl converter and the SFT dataset builder (``docs/data_schema.md``)."""
