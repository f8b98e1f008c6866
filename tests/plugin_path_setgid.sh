#!/bin/sh
# docs/host-guide.md: BACKPLANE_PLUGIN_PATH is ignored in set-uid/set-gid
# programs (core/src/runtime.cpp reads the environment only when
# getauxval(AT_SECURE) is 0). A copy of `backplane` made set-gid and run as
# an unprivileged user must not load a plugin from that path; the same
# program without the bit, as the same user, must (so the path is shown to
# work at all).
#
# Catches: the environment read in a set-gid program (a user could then make
# a privileged host load any library of theirs), and a BACKPLANE_PLUGIN_PATH
# that is never read (the plain run would not load the plugin either).
#
# Usage: plugin_path_setgid.sh BACKPLANE_BINARY FIXTURE_DIR
# (FIXTURE_DIR holds fx_good.json and libfx_good.so). Exit 77: skipped.
set -u
bin=$1
fixtures=$2
user=65534

if [ "$(id -u)" != 0 ]; then echo "SKIPPED: needs root (a set-gid copy run as uid $user)"; exit 77; fi
if ! command -v setpriv >/dev/null 2>&1; then echo "SKIPPED: setpriv (util-linux) is missing"; exit 77; fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/bp-setgid-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
chmod 0755 "$dir"
if findmnt -no OPTIONS -T "$dir" 2>/dev/null | tr ',' '\n' | grep -qx nosuid; then
  echo "SKIPPED: $dir is on a nosuid mount"
  exit 77
fi

# Everything the unprivileged user runs or reads, in a 0755 folder.
mkdir "$dir/plugins"
cp "$fixtures/fx_good.json" "$fixtures/libfx_good.so" "$dir/plugins/" || exit 1
cp "$bin" "$dir/backplane-plain" || exit 1
cp "$bin" "$dir/backplane-setgid" || exit 1
cp "$(command -v id)" "$dir/id-setgid" || exit 1
chmod -R a+rX "$dir"
# Group 1 (not the user's): the bit makes the effective group differ from
# the real one, which is what sets AT_SECURE.
chown 0:1 "$dir/backplane-setgid" "$dir/id-setgid"
chmod 2755 "$dir/backplane-setgid" "$dir/id-setgid"

as_user() { (cd "$dir" && setpriv --reuid=$user --regid=$user --clear-groups -- env BACKPLANE_PLUGIN_PATH="$dir/plugins" "$@"); }

egid=$(as_user "$dir/id-setgid" -g)
if [ "$egid" != 1 ]; then
  echo "SKIPPED: the set-gid bit has no effect here (a set-gid id reports group '$egid', not 1)"
  exit 77
fi
if ! as_user "$dir/backplane-plain" --help >/dev/null 2>&1; then
  echo "SKIPPED: uid $user cannot run $bin (its libraries are not readable by that user?)"
  exit 77
fi

status=0
plain=$(as_user "$dir/backplane-plain" devices --load 2>&1)
echo "--- plain, as uid $user:"; echo "$plain"
if ! echo "$plain" | grep -q '^fx_good .*loaded'; then
  echo "FAILED: the plugin on BACKPLANE_PLUGIN_PATH was not loaded by the plain program"
  status=1
fi

setgid=$(as_user "$dir/backplane-setgid" devices --load 2>&1)
rc=$?
echo "--- set-gid, as uid $user:"; echo "$setgid"
if [ $rc != 0 ] && grep -qa -e 'libtsan[.]so' -e 'libasan[.]so' "$bin"; then
  # TSan re-executes itself (ASLR off), which a set-gid program may not do.
  echo "SKIPPED: this sanitizer build does not run set-gid (exit $rc)"
  exit 77
fi
if [ $rc != 0 ] || ! echo "$setgid" | grep -q '^cpu '; then
  echo "FAILED: the set-gid program did not run or did not list the cpu device (exit $rc)"
  status=1
fi
if echo "$setgid" | grep -q 'fx_good'; then
  echo "FAILED: the set-gid program read BACKPLANE_PLUGIN_PATH"
  status=1
fi
[ $status = 0 ] && echo "passed"
exit $status
