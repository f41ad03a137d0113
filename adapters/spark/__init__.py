"""Where georep meets Spark: the ledger audit, and the ``georep`` format (a Structured
Streaming source, a sink, and the ``foreachBatch`` helper; SPEC §6, docs/spark.md).

Install with ``pip install 'georep[spark]'``.

The names below are imported on first use: Spark starts a Python process for each planned
read or write of the ``georep`` format and for each Python worker, and each imports
``georep.adapters.spark._datasource`` (through this package); loading the audit, its
reference and the plots there as well cost every such process over a second.
"""

from __future__ import annotations

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
    "table_audit",
    "write_plots",
    "write_session_ledger",
    "write_synthetic_ledger",
]

from typing import TYPE_CHECKING, Any

from georep._extras import import_on_first_use, require_extra

require_extra("georep.adapters.spark", "spark", "pyarrow", "pyspark")

if TYPE_CHECKING:
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
    from ._table_audit import table_audit

_WHERE = {
    "SOURCE_SCHEMA": "_staging",
    "Aggregates": "_report",
    "SyntheticLedger": "_synthetic",
    "audit": "_audit",
    "build_report": "_report",
    "foreach_batch_sink": "_sink",
    "reference_aggregates": "_reference",
    "reference_audit": "_reference",
    "register": "_register",
    "report_table": "_table",
    "sink_message_id": "_sink",
    "spark_aggregates": "_audit",
    "spark_session": "_session",
    "table_audit": "_table_audit",
    "write_plots": "_plots",
    "write_session_ledger": "_synthetic",
    "write_synthetic_ledger": "_synthetic",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return import_on_first_use(globals(), f".{module}", name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
