"""`muster demo` and the shipped example policies it runs on."""

from pathlib import Path

#: the example policies (package data, so an installed `muster demo` has them too), each with
#: its PolicyTest in tests/ beside it
EXAMPLE_POLICIES = Path(__file__).resolve().parent / "policies"
