"""Measuring kernels honestly: the one evaluation engine (`engine.py`: compile -> verify -> time -> store), the
tuner over a space (`tuner.py`), shape sweeps (`sweep.py`), the one dispatch-table format (`dispatch.py`), the
timing function (`measure.py`), verification against float64 (`verify.py`), the results store (`store.py`),
search strategies (`search.py`) and reports (`report.py`)."""
