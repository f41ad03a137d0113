"""Where georep meets Spark: the ledger audit, and the ``georep`` format (a Structured
Streaming source, a sink, and the ``foreachBatch`` helper; SPEC §6, docs/spark.md).

Install with ``pip install 'georep[spark]'``.
"""

from __future__ import annotations

from georep._extras import require_extra

require_extra("georep.adapters.spark", "spark", "pyarrow", "pyspark")

from ._audit import audit, spark_aggregates
from ._plots import write_plots
from ._reference import reference_aggregates, reference_audit
from ._register import register
from ._report import Aggregates, build_report
from ._session import spark_session
from ._sink import foreach_batch_sink, sink_message_id
from ._staging import SOURCE_SCHEMA
from ._synthetic import SyntheticLedger, write_session_ledger, write_synthetic_ledger
from ._table import report_table

__all__ = [
    "SOURCE_SCHEMA",
    "Aggregates",
    "SyntheticLedger",
    "audit",
    "build_report",
    "foreach_batch_sink",
    "reference_aggregates",
    "reference_audit",
    "register",
    "report_table",
    "sink_message_id",
    "spark_aggregates",
    "spark_session",
    "write_plots",
    "write_session_ledger",
    "write_synthetic_ledger",
]
