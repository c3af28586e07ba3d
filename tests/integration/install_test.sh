#!/usr/bin/env bash
# `meson install` puts headers, the library, the tool and dpipe.pc in place; a project outside the tree
# then builds against them with nothing but `pkg-config --cflags --libs dpipe` (a plain g++ line with
# -Wall -Wextra -Werror, and through meson's dependency('dpipe')), and it and the installed tool run
# without LD_LIBRARY_PATH.
#
# The install is staged (DESTDIR) and dpipe.pc's prefix pointed at the stage, as if dpipe had been
# configured with that prefix: the .pc's -Wl,-rpath,${libdir} then names the staged library, as it
# names the real libdir in a real install. The tool's runpath is relative to the tool ($ORIGIN), so the
# staged tool finds the staged library on its own. Each program's libdpipe is checked to resolve inside
# the stage, not to a copy in the build tree or on the system.
set -euo pipefail
BUILD=$1 SRC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
unset LD_LIBRARY_PATH
# Any build flags of the enclosing build (sanitizers) must not leak into the outside project.
unset CXXFLAGS LDFLAGS
fail() { echo "FAIL: $*" >&2; exit 1; }

meson install -C "$BUILD" --destdir "$WORK/stage" --no-rebuild >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; exit 1; }
pc=$(find "$WORK/stage" -name dpipe.pc | head -n1)
[ -n "$pc" ] || fail "dpipe.pc was not installed"
incdir=$(dirname "$(find "$WORK/stage" -path '*include/dpipe/dpipe.hpp' | head -n1)")
[ -f "$incdir/nodes/shuffle.hpp" ] || fail "headers missing"

# What is installed is complete: the JSON spec front end's headers (its library is the tool's, not
# installed) stay out, and every header an installed header includes is installed.
for h in json_spec.hpp builtins.hpp; do [ ! -e "$incdir/$h" ] || fail "dpipe/$h is installed, its library is not"; done
(cd "$incdir/.." && grep -rhoE '#include "dpipe/[^"]+"' dpipe | sort -u | sed 's/#include "//; s/"$//') |
  while read -r inc; do [ -f "$incdir/../$inc" ] || fail "an installed header includes $inc, which is not installed"; done

# A versioned SONAME, and the development link pointing at it.
libdir=$(dirname "$(find "$WORK/stage" -name 'libdpipe.so' | head -n1)")
soname=$(readelf -d "$libdir/libdpipe.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ "$soname" =~ ^libdpipe\.so\.[0-9]+$ ]] || fail "SONAME is '$soname', expected libdpipe.so.N"
[ -f "$libdir/$soname" ] || fail "$soname is not installed next to libdpipe.so"
echo "SONAME $soname"

# Point the .pc file at the staged prefix.
prefix=$(sed -n 's/^prefix=//p' "$pc")
mkdir -p "$WORK/pc"
sed "s#^prefix=.*#prefix=$WORK/stage$prefix#" "$pc" >"$WORK/pc/dpipe.pc"
export PKG_CONFIG_PATH="$WORK/pc"
flags=$(pkg-config --cflags --libs dpipe)
echo "pkg-config --cflags --libs dpipe: $flags"

# The loader must take libdpipe from the stage, with no LD_LIBRARY_PATH (unset above).
check_resolves_in_stage() {  # PROGRAM
  local where
  where=$(ldd "$1" | sed -n 's/^[[:space:]]*libdpipe\.so[^ ]* => \([^ ]*\).*/\1/p')
  [ -n "$where" ] || { ldd "$1"; fail "$1: libdpipe is not found without LD_LIBRARY_PATH"; }
  case "$where" in "$WORK/stage"/*) ;; *) fail "$1 loads libdpipe from $where, not from the install" ;; esac
}
rpath_in_pc=0
grep -q -- '-Wl,-rpath' "$pc" && rpath_in_pc=1  # not for a prefix of /usr, which the loader searches
run_user_program() {  # PROGRAM
  if [ $rpath_in_pc = 1 ]; then
    check_resolves_in_stage "$1"
    "$1"
  else
    LD_LIBRARY_PATH="$libdir" "$1"
  fi
}

# 1. A plain compile line: pkg-config's flags and the strictest warnings a user is likely to use.
# shellcheck disable=SC2046  # split as a user's shell splits it
g++ -Wall -Wextra -Werror -o "$WORK/external_plain" "$SRC/examples/external/main.cpp" $(pkg-config --cflags --libs dpipe)
readelf -d "$WORK/external_plain" | grep -q "NEEDED.*\[$soname\]" || fail "the user program does not need $soname"
run_user_program "$WORK/external_plain"

# 2. Every installed header in one user translation unit, and every option struct filled twice with a
# designated initializer that leaves members out (g++ warns, under -Wextra, about each member left out
# that has no default member initializer): once naming its first member, once its `name`, so each member
# is left out once. Warning-free under -Wall -Wextra -Werror, and it links.
probe="$WORK/probe.cpp"
{
  (cd "$incdir/.." && find dpipe -name '*.hpp' | sort | sed 's/.*/#include <&>/')
  echo 'int main() {'
  echo '  [[maybe_unused]] dpipe::Layout layout{.rank = 0};'
  n=0
  # shellcheck disable=SC2013  # the names are words
  for s in $(grep -rhoE '^struct [A-Za-z]+Options \{' "$incdir" | awk '{print $2}' | sort -u); do
    body=$(awk "/^struct $s \\{/{p=1;next} p&&/^\\};/{exit} p" "$(grep -rlE "^struct $s \{" "$incdir" | head -n1)")
    # Data members: `  type name;`, `  type name = v;`, `  type name{v};` (no parentheses: not functions).
    members=$(sed -nE 's/^  [A-Za-z_][A-Za-z_0-9:<>, *&]* \**([a-z_][a-z_0-9]*)( = [^;(]*|\{[^;(]*\})?;( *\/\/.*)?$/\1/p' <<<"$body")
    first=$(head -n1 <<<"$members")
    [ -n "$first" ] || fail "no data member found in $s: fix the probe in this script"
    for m in $first $(grep -x name <<<"$members" || true); do
      n=$((n + 1))
      echo "  [[maybe_unused]] dpipe::$s o$n{.$m = dpipe::$s{}.$m};"
    done
  done
  echo '}'
} >"$probe"
[ "$(grep -c 'Options o' "$probe")" -ge 20 ] || { cat "$probe"; fail "the probe found too few option structs"; }
# shellcheck disable=SC2046
g++ -Wall -Wextra -Werror -o "$WORK/probe" "$probe" $(pkg-config --cflags --libs dpipe) || { cat "$probe"; fail "the installed headers warn or fail in user code"; }

# 3. <dpipe/dpipe.hpp> brings no POSIX header of its own: any that appear come from the standard
# library's headers (libstdc++'s <atomic> includes <unistd.h>), never directly from a dpipe header.
# shellcheck disable=SC2046
g++ $(pkg-config --cflags dpipe) -H -fsyntax-only -x c++ - <<<'#include <dpipe/dpipe.hpp>' 2>"$WORK/includes.txt" >/dev/null
awk -v posix='/(unistd|fcntl|signal|pthread|dirent|sys/[a-z_]+)\\.h$' '
  /^\.+ / { depth = length($1); path[depth] = $2
            if ($2 ~ posix && path[depth - 1] ~ /\/dpipe\//) { print path[depth - 1] " includes " $2; bad = 1 } }
  END { exit bad }' "$WORK/includes.txt" || fail "dpipe headers include POSIX headers"
if grep -qE '/(fcntl|sys/mman|sys/stat)\.h$' "$WORK/includes.txt"; then
  grep -nE '/(fcntl|sys/mman|sys/stat)\.h$' "$WORK/includes.txt"
  fail "<dpipe/dpipe.hpp> pulls in fcntl.h, sys/mman.h or sys/stat.h"
fi

# 4. Through meson, as another meson project would: dependency('dpipe').
meson setup "$WORK/ext" "$SRC/examples/external" >"$WORK/setup.log" 2>&1 || { cat "$WORK/setup.log"; exit 1; }
meson compile -C "$WORK/ext" >"$WORK/compile.log" 2>&1 || { cat "$WORK/compile.log"; exit 1; }
run_user_program "$WORK/ext/external_example"

# 5. The installed tool finds its library through its own runpath.
tool=$(find "$WORK/stage" -path '*/bin/dpipe' | head -n1)
[ -n "$tool" ] || fail "the dpipe tool was not installed"
readelf -d "$tool" | grep -E 'RUNPATH|RPATH'
check_resolves_in_stage "$tool"
echo '{"seed": 1, "pipeline": [{"op": "range", "stop": 10}, {"op": "batch", "size": 4}]}' >"$WORK/spec.json"
"$tool" run "$(cat "$WORK/spec.json")" >"$WORK/tool.out" 2>&1 || { cat "$WORK/tool.out"; fail "the installed tool did not run"; }
[ "$(wc -l <"$WORK/tool.out")" -ge 3 ] || { cat "$WORK/tool.out"; fail "the installed tool printed too little"; }
# 6. The Python package, where Debian's /usr/bin/python3 looks for a package of this prefix (for
# /usr/local: /usr/local/lib/python3.X/dist-packages), and its extension finds the staged libdpipe
# through its relative runpath.
ext=$(find "$WORK/stage" -name '_dpipe.cpython-*.so' | head -n1)
if [ -n "$ext" ]; then
  pkgdir=$(dirname "$(dirname "$ext")")
  site=${pkgdir#"$WORK/stage"}
  /usr/bin/python3 -c "import sys; sys.exit(0 if '$site' in sys.path else 1)" ||
    fail "the Python package went to $site, which /usr/bin/python3 does not search"
  check_resolves_in_stage "$ext"
  PYTHONPATH=$pkgdir /usr/bin/python3 -c "
import dpipe, sys
assert dpipe.__file__.startswith('$pkgdir'), dpipe.__file__
assert 'torch' not in sys.modules
assert [b.tolist() for b in dpipe.Loader(dpipe.range(0, 10) | dpipe.batch(size=4))] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
" || fail "the installed Python package does not import and run"
  echo "python package: $site"
fi
echo "install test: ok"
