"""Where georep meets Spark: the ledger audit and the ``foreachBatch`` sink (SPEC §6).

Install with ``pip install 'georep[spark]'``.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "georep.adapters.spark needs pyspark and pyarrow: pip install 'georep[spark]'"
    ) from exc

from ._synthetic import SyntheticLedger, write_synthetic_ledger

__all__ = ["SyntheticLedger", "write_synthetic_ledger"]
