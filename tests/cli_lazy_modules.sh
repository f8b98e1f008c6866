#!/bin/sh
# The `backplane` program maps gRPC, protobuf, abseil and libonnx only for
# the commands that need them: `serve` opens libbackplane_cli_serve.so, the
# ONNX importer (import, run MODEL.onnx) libbackplane_cli_onnx.so, both
# found relative to the program (tools/cli_module.hpp). The dynamic loader's
# own trace (LD_DEBUG=libs) says which libraries each run initialized.
#
# Catches: the program linked against the server or the importer again (every
# command, `devices` first, then pays for ~60 libraries at start), a command
# that opens a module it does not need (run GRAPH.json), a module that is not
# built with the program or not found where the program looks, a serve or an
# import broken by the move, and a missing module reported without its path.
#
# Usage: cli_lazy_modules.sh BACKPLANE HAVE_ONNX HAVE_REMOTE HAVE_CPU MODEL.onnx
# (HAVE_*: 1 or 0, as built; MODEL.onnx: a small model the importer takes).
set -u
bin=$1
have_onnx=$2
have_remote=$3
have_cpu=$4
model=$5
status=0
work=$(mktemp -d "${TMPDIR:-/tmp}/bp-lazy-XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; status=1; }

# The libraries a run initialized, one path a line (the program's own
# stdout and stderr go to $work/out and $work/err).
loaded() {
  LD_DEBUG=libs "$bin" "$@" > "$work/out" 2> "$work/trace"
  rc=$?
  grep -v '^ *[0-9]*: ' "$work/trace" > "$work/err"
  sed -n 's/.*calling init: //p' "$work/trace" > "$work/libs"
  return $rc
}
heavy='/lib(grpc|gpr|upb|address_sorting|absl|protobuf|onnx|re2|cares|backplane_onnx|backplane_remote_wire|backplane_cli_)[^/]*$'

# devices: the core (libbackplane.so) and nothing of the server's or the importer's. The trace
# must show the core itself, or LD_DEBUG did nothing and the check proves nothing.
for args in "devices" "devices --json" "ops"; do
  # shellcheck disable=SC2086
  loaded $args || fail "backplane $args: exit $rc: $(cat "$work/err")"
  if ! grep -q '/libbackplane\.so' "$work/libs"; then
    fail "backplane $args: LD_DEBUG=libs shows no libbackplane.so (no trace to check)"
  elif grep -Eq "$heavy" "$work/libs"; then
    fail "backplane $args loaded $(grep -Ec "$heavy" "$work/libs") libraries of the server or the importer, among them:"
    grep -E "$heavy" "$work/libs" | head -5
  else
    echo "backplane $args: $(wc -l < "$work/libs") libraries, none of the server's or the importer's"
  fi
done

if [ "$have_remote" = 1 ]; then
  # The serve module loads and parses: a missing token is its own message.
  loaded serve --listen 127.0.0.1:1
  [ $rc -eq 1 ] || fail "serve without --token-file: exit $rc, want 1"
  grep -q 'serve: --token-file FILE is required' "$work/err" || fail "serve without --token-file said: $(cat "$work/err")"
  grep -q '/libbackplane_cli_serve\.so$' "$work/libs" || fail "serve did not load libbackplane_cli_serve.so"
  grep -q '/libgrpc' "$work/libs" || fail "serve did not load gRPC"
  "$bin" serve --help | head -1 | grep -q '^usage: backplane serve' || fail "serve --help: no usage"
fi

if [ "$have_onnx" = 1 ]; then
  loaded import "$model" --out "$work/imported" || fail "import $model: exit $rc: $(cat "$work/err")"
  grep -q '^imported ' "$work/out" || fail "import said: $(cat "$work/out" "$work/err")"
  [ -f "$work/imported/graph.json" ] || fail "import wrote no graph.json"
  grep -q '/libbackplane_cli_onnx\.so$' "$work/libs" || fail "import did not load libbackplane_cli_onnx.so"
  grep -q '/libbackplane_cli_serve\.so$' "$work/libs" && fail "import loaded the serve module"
  loaded import "$work/no-such-model.onnx" --out "$work/none"
  [ $rc -eq 1 ] || fail "import of a missing model: exit $rc, want 1"
  grep -q "^backplane: error: .*no-such-model\.onnx" "$work/err" || fail "import of a missing model said: $(cat "$work/err")"
  if [ "$have_cpu" = 1 ]; then
    export BACKPLANE_PLUGIN_PATH=
    loaded run "$model" --device cpu --out "$work/run_onnx" || fail "run $model: exit $rc: $(cat "$work/err")"
    grep -q '/libbackplane_cli_onnx\.so$' "$work/libs" || fail "run MODEL.onnx did not load libbackplane_cli_onnx.so"
    ls "$work/run_onnx"/*.npy > /dev/null 2>&1 || fail "run $model wrote no outputs"
    # The imported graph runs without the importer.
    loaded run "$work/imported/graph.json" --device cpu --out "$work/run_graph" || fail "run graph.json: exit $rc: $(cat "$work/err")"
    grep -Eq "$heavy" "$work/libs" && fail "run graph.json loaded: $(grep -E "$heavy" "$work/libs" | head -3)"
    ls "$work/run_graph"/*.npy > /dev/null 2>&1 || fail "run graph.json wrote no outputs"
  fi
fi

# A copy of the program with no modules beside it: each command that needs
# one names the path it looked at; the others run.
mkdir -p "$work/copy/bin"
cp "$bin" "$work/copy/bin/backplane"
copy="$work/copy/bin/backplane"
"$copy" devices > /dev/null 2>&1 || fail "a copy of the program without its modules: devices fails"
if [ "$have_remote" = 1 ]; then
  "$copy" serve --listen 127.0.0.1:1 > /dev/null 2> "$work/err"
  rc=$?
  [ $rc -eq 1 ] || fail "serve without its module: exit $rc, want 1"
  grep -q "^backplane: error: backplane serve needs the module $work/copy/.*/libbackplane_cli_serve\.so, which is missing" "$work/err" ||
    fail "serve without its module said: $(cat "$work/err")"
fi
if [ "$have_onnx" = 1 ]; then
  "$copy" import "$model" --out "$work/x" > /dev/null 2> "$work/err"
  rc=$?
  [ $rc -eq 1 ] || fail "import without its module: exit $rc, want 1"
  grep -q "^backplane: error: the ONNX importer needs the module $work/copy/.*/libbackplane_cli_onnx\.so, which is missing" "$work/err" ||
    fail "import without its module said: $(cat "$work/err")"
fi

[ $status -eq 0 ] && echo "the server and the importer load only for the commands that need them"
exit $status
