"""Data: episode records (``schema``), trajectory stores (``store``: Parquet + PNG), privacy masking
(``privacy`` text, ``privacy_image`` images, ``privacy_corpus`` its labelled benchmark corpus), collection
with masking before storage and human-annotation import (``collect``), the privacy audit (``audit``), the
AndroidControl converter (``androidcontrol``) and the SFT dataset builder (``sft``).
See ``docs/data_schema.md``."""

from mobilerl.data.schema import (
    SCHEMA_VERSION,
    JsonlWriter,
    StepRecord,
    Trajectory,
    iter_jsonl,
    read_jsonl,
    write_jsonl,
)

__all__ = [
    "SCHEMA_VERSION",
    "JsonlWriter",
    "StepRecord",
    "Trajectory",
    "iter_jsonl",
    "read_jsonl",
    "write_jsonl",
]
