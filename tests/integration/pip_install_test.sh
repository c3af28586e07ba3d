#!/usr/bin/env bash
# pip builds a wheel of the source tree through meson-python (pyproject.toml), and the wheel installs into
# a venv that sees Debian's numpy (--system-site-packages): the package imports from the venv, not from a
# build tree, with its version the C++ library's, runs a pipeline with a Python callable, and the venv
# has the dpipe tool. The wheel is built unoptimised here (the test is of the packaging, and a release
# build takes minutes more on two cores).
set -euo pipefail
SRC=$1 VERSION=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
unset PYTHONPATH DPIPE_BUILD_ROOT
fail() { echo "FAIL: $*" >&2; exit 1; }

/usr/bin/python3 -m venv --system-site-packages "$WORK/venv"
PY="$WORK/venv/bin/python"
"$PY" -m pip wheel --no-build-isolation --no-deps --no-index -w "$WORK/wheels" \
  --config-settings=setup-args=-Doptimization=0 "$SRC" >"$WORK/wheel.log" 2>&1 || { tail -40 "$WORK/wheel.log"; fail "pip wheel"; }
wheel=$(ls "$WORK"/wheels/dpipe-"$VERSION"-*.whl 2>/dev/null | head -n1)
[ -n "$wheel" ] || { ls "$WORK/wheels"; fail "no wheel of version $VERSION"; }
"$PY" -m pip install --no-build-isolation --no-index "$wheel" >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; fail "pip install"; }

cd "$WORK"
"$PY" - "$WORK/venv" "$VERSION" <<'PYEOF' || fail "the installed package"
import pathlib, sys
import dpipe
venv, version = pathlib.Path(sys.argv[1]).resolve(), sys.argv[2]
assert pathlib.Path(dpipe.__file__).resolve().is_relative_to(venv), dpipe.__file__
assert dpipe.__version__ == version, (dpipe.__version__, version)
root = pathlib.Path(dpipe.__file__).parent
assert (root / "py.typed").exists() and (root / "__init__.pyi").exists()
p = dpipe.range(0, 10) | dpipe.map(lambda x: x * x) | dpipe.filter(lambda x: x % 2 == 0) | dpipe.batch(size=2)
assert [b.tolist() for b in dpipe.Loader(p)] == [[0, 4], [16, 36], [64]]
print("installed", dpipe.__version__, "from", root)
PYEOF
"$WORK/venv/bin/dpipe" ops >/dev/null || fail "the dpipe tool in the venv"
echo "pip wheel and install: ok"
