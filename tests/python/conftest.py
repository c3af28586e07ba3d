"""Shared helpers: the tool (to compare with), a temporary directory, the semantics cases."""
import json
import os
import pathlib
import subprocess

import pytest

SOURCE_ROOT = pathlib.Path(os.environ.get("DPIPE_SOURCE_ROOT", pathlib.Path(__file__).resolve().parents[2]))
BUILD_ROOT = pathlib.Path(os.environ.get("DPIPE_BUILD_ROOT", SOURCE_ROOT / "build-test"))


def tool_elements(spec, rank=0, world_size=1, workers=1, extra=()):
    """What `dpipe run` prints for a spec: one JSON value per element."""
    out = subprocess.run([str(BUILD_ROOT / "tools" / "dpipe"), "run", "-", "--rank", str(rank), "--world-size",
                          str(world_size), "--workers", str(workers), *extra],
                         input=json.dumps(spec), capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def plain(x):
    """An element as the tool's JSON shows it (numpy arrays as lists)."""
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def semantics_cases():
    return sorted((SOURCE_ROOT / "tests" / "semantics" / "cases").glob("*.case.json"))


@pytest.fixture
def tmp(tmp_path):
    return tmp_path
