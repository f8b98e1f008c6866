# Sourced by the tests that read oneDNN's own execution log (onednn_*.sh):
# skips (exit 77) on a machine where the CPU plugin uses no oneDNN for f32
# (no AVX-512), and gives each a temporary folder $dir, removed at exit.
desc=$(BACKPLANE_PLUGIN_PATH= "$bin" devices --load 2>&1 | grep -A1 '^cpu ' | tail -1)
echo "cpu: $desc"
case "$desc" in
  *oneDNN*avx512_core*) ;;
  *) echo "the CPU plugin uses no oneDNN for f32 here: skipped"; exit 77 ;;
esac
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
