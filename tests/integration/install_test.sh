#!/usr/bin/env bash
# `meson install` puts headers, the library and dpipe.pc in place; a project outside the tree then
# builds against them through pkg-config (examples/external) and runs.
set -euo pipefail
BUILD=$1 SRC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
meson install -C "$BUILD" --destdir "$WORK/stage" --no-rebuild >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; exit 1; }
pc=$(find "$WORK/stage" -name dpipe.pc | head -n1)
[ -n "$pc" ] || { echo "dpipe.pc was not installed"; exit 1; }
test -f "$(find "$WORK/stage" -path '*include/dpipe/nodes/shuffle.hpp' | head -n1)" || { echo "headers missing"; exit 1; }
# Point the .pc file at the staged prefix.
prefix=$(sed -n 's/^prefix=//p' "$pc")
mkdir -p "$WORK/pc"
sed "s#^prefix=.*#prefix=$WORK/stage$prefix#" "$pc" >"$WORK/pc/dpipe.pc"
export PKG_CONFIG_PATH="$WORK/pc"
# Any build flags of the enclosing build (sanitizers) must not leak into the outside project.
unset CXXFLAGS LDFLAGS
meson setup "$WORK/ext" "$SRC/examples/external" >"$WORK/setup.log" 2>&1 || { cat "$WORK/setup.log"; exit 1; }
meson compile -C "$WORK/ext" >"$WORK/compile.log" 2>&1 || { cat "$WORK/compile.log"; exit 1; }
libdir=$(dirname "$(find "$WORK/stage" -name 'libdpipe.so*' | head -n1)")
LD_LIBRARY_PATH="$libdir" "$WORK/ext/external_example"
