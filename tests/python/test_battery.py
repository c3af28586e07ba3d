"""The conformance battery through Python: every spec of the tool's battery (one per op and mode, in
tests/integration/battery_cli_test.py) run by a Loader gives exactly the tool's stream, for one and two
workers, and a Loader stopped at the breakpoints {0, 1, 5, middle, end} resumes from its state_dict into
exactly the rest."""
import base64
import pickle
import sys

import pytest

import dpipe
from conftest import SOURCE_ROOT, tool_elements

sys.path.insert(0, str(SOURCE_ROOT / "tests" / "integration"))
import battery_cli_test as battery  # noqa: E402  (writes the battery's data files into a temporary directory)


def as_tool_json(x, records):
    """An element as the tool prints it: arrays as lists, dicts by key, records as base64 text, other bytes that are not
    UTF-8 as {"base64": ...}."""
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [as_tool_json(v, records) for v in x]
    if isinstance(x, dict):  # a structured record: numpy arrays as lists, by field name
        return {k: as_tool_json(v, records) for k, v in x.items()}
    if isinstance(x, bytes):
        return base64.b64encode(x).decode() if records else x.decode()
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return {"base64": base64.b64encode(x.encode("utf-8", "surrogateescape")).decode()}
    return x


@pytest.mark.parametrize("workers", battery.WORKERS)
@pytest.mark.parametrize("name", sorted(battery.SPECS))
def test_battery_spec_through_python(name, workers):
    spec = {"seed": 11, "pipeline": battery.SPECS[name]}
    records = "'records'" in str(spec["pipeline"])
    tool = tool_elements(spec, workers=workers)
    want = [as_tool_json(x, records) for x in dpipe.Loader(spec, workers=workers)]
    assert want == tool  # records too: the tool prints the same bytes as base64, in the same order
    for at in sorted({0, 1, 5, len(want) // 2, len(want)}):
        loader = dpipe.Loader(spec, workers=workers)
        it = iter(loader)
        head = [as_tool_json(next(it), records) for _ in range(at)]
        state = pickle.loads(pickle.dumps(loader.state_dict()))
        again = dpipe.Loader(spec, workers=workers)
        again.load_state_dict(state)
        assert head + [as_tool_json(x, records) for x in again] == want, f"breakpoint {at}"
