#!/bin/sh
# `backplane CMD --help` (or -h, anywhere among CMD's arguments) prints that
# command's usage and exits 0: `run --help` once took --help for the graph
# file ("graph file --help: cannot open"). An unknown command still fails.
bin="$1"
status=0
for cmd in devices run import demo conformance bench manifest ops serve; do
  for flag in --help -h; do
    out=$("$bin" $cmd x.json $flag 2>&1)
    rc=$?
    first=$(echo "$out" | head -1)
    case "$first" in
      "usage: backplane $cmd"*) ;;
      *)
        # import and serve exist only in builds with ONNX and gRPC.
        if echo "$out" | grep -q "unknown command '$cmd'" && { [ $cmd = import ] || [ $cmd = serve ]; }; then continue; fi
        echo "$cmd $flag: want its usage, got: $first"; status=1 ;;
    esac
    [ $rc -eq 0 ] || { echo "$cmd $flag: exit $rc"; status=1; }
    echo "$out" | grep -q "cannot open" && { echo "$cmd $flag: took the flag for a file"; status=1; }
  done
done
"$bin" nosuch --help > /dev/null 2>&1
[ $? -eq 2 ] || { echo "an unknown command with --help did not fail with 2"; status=1; }
[ $status -eq 0 ] && echo "every command's --help prints its usage"
exit $status
