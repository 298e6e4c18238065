#!/usr/bin/env bash
# gRPC built with ThreadSanitizer, for `make check-tsan`: prints the folder of its libraries.
#
#   scripts/tsan-grpc.sh ensure    build it, or reuse the cached build; print its lib folder
#
# Why: Debian's libgrpc is not instrumented, so TSan sees only the half of gRPC's callback
# code that its headers inline into our binaries, not the other half that orders it inside
# libgrpc, and reports races on memory gRPC hands from one call to the next (SECURITY.md,
# "Fuzzing and sanitizers"). This builds the very source package the machine's libgrpc++ came
# from (same version, Debian's patches, Debian's CMake options, the system Abseil, protobuf,
# c-ares, re2, OpenSSL and zlib), so the libraries keep their sonames and ABI: the TSan build
# of trainstep links against the system's as usual and loads these in their place (its RUNPATH,
# TRAINSTEP_TSAN_GRPC in CMake); each library finds the others beside it ($ORIGIN).
#
# Cached outside the repository in $TRAINSTEP_TSAN_GRPC_CACHE (default /var/cache/trainstep),
# one folder per source version and recipe; a cold build (fetch included) took 8.5 minutes on
# 2 cores, a rebuild from a warm ccache 18 s.
# Source comes from the host's own Debian archive, as a deb-src entry given to apt for this
# command only (the host's apt configuration is not changed).
set -euo pipefail

CACHE=${TRAINSTEP_TSAN_GRPC_CACHE:-/var/cache/trainstep}
JOBS=${JOBS:-$(nproc)}
CC=${TSAN_CC:-clang-14}
CXX=${TSAN_CXX:-clang++-14}
# Bump when the way the libraries are built changes: forces a fresh build.
RECIPE=1
# The libraries trainstep links, and what they load of gRPC's own.
LIBS="libgrpc++.so.1.51 libgrpc++_reflection.so.1.51 libgrpc.so.29 libgpr.so.29 libupb.so.29
libaddress_sorting.so.29"

log() { echo "tsan-grpc: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "${1:-}" = ensure ] || { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# The source package and version of the installed libgrpc++ (a binNMU's "+b1" is not in it).
read -r SRC VERSION < <(dpkg-query -W -f '${source:Package} ${source:Version}\n' libgrpc++-dev 2>/dev/null) ||
  die "libgrpc++-dev is not installed (scripts/install-deps.sh installs it)"
UPSTREAM=${VERSION%-*}
UPSTREAM=${UPSTREAM#*:}
OUT="$CACHE/tsan-grpc-$VERSION-r$RECIPE"
if [ -f "$OUT/done" ]; then
  echo "$OUT/lib"
  exit 0
fi

# What the build needs beyond `make deps`: libprotoc for gRPC's code generator (reflection's
# generated code), dpkg-source to unpack the package with Debian's patches.
missing=""
for pkg in libprotoc-dev dpkg-dev clang-14 ninja-build; do
  dpkg-query -W -f '${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed' || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
  log "installing$missing"
  # shellcheck disable=SC2086  # a list of package names
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >&2
fi

WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/tsan-grpc.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# Killed (Ctrl-C, a CI timeout): still run the EXIT trap, so no half-built tree is left.
trap 'exit 143' INT TERM

# A deb-src entry for every archive the host installs Debian packages from, for its release.
# shellcheck disable=SC1091
release=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$release" ] || die "/etc/os-release names no VERSION_CODENAME"
uris=""
# Only the files that exist: a host may have deb822 .sources alone (no sources.list).
for list in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$list" ] || continue
  case $list in
  *.sources) uris="$uris $(sed -n 's/^URIs:[[:space:]]*//p' "$list")" ;;
  *) uris="$uris $(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\{0,1\}\([^[:space:]]\+\).*/\2/p' "$list")" ;;
  esac
done
uris=$(echo "$uris" | tr ' ' '\n' | grep -v -e '^$' -e security | sort -u | paste -sd ' ')
[ -n "$uris" ] || die "the host's apt configuration names no Debian archive"
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/parts" "$WORK/src"
{
  echo "Types: deb-src"
  echo "URIs: $uris"
  echo "Suites: $release"
  echo "Components: main"
  echo "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
} >"$WORK/apt/src.sources"
APT=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$WORK/apt/parts"
  -o "Dir::State::Lists=$WORK/apt/lists" -o "APT::Sandbox::User=root")
cp "$WORK/apt/src.sources" "$WORK/apt/parts/"
log "fetching $SRC $VERSION (source) from $uris"
apt-get "${APT[@]}" -q update >&2
(cd "$WORK/src" && apt-get "${APT[@]}" -q source --download-only "$SRC=$VERSION" >&2)
dpkg-source -x "$WORK/src/${SRC}_${VERSION#*:}.dsc" "$WORK/src/tree" >&2

# Debian's options (debian/rules, COMMON_BUILD_FLAGS), shared libraries, plus TSan.
FLAGS="-O1 -gline-tables-only -fsanitize=thread"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # Paths relative to the (temporary) tree: a rebuild (a new recipe) hits the cache.
  export CCACHE_BASEDIR="$WORK" CCACHE_NOHASHDIR=1
fi
log "building (~9 min cold on 2 cores; $JOBS jobs)"
# shellcheck disable=SC2016  # $ORIGIN is the dynamic loader's, not the shell's
cmake -S "$WORK/src/tree" -B "$WORK/build" -G Ninja "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="$FLAGS" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$FLAGS" \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' \
  -DBUILD_SHARED_LIBS=ON -DgRPC_BUILD_TESTS=OFF -DgRPC_BUILD_CODEGEN=ON \
  -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package -DgRPC_PROTOBUF_PROVIDER=package \
  -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package -DgRPC_ZLIB_PROVIDER=package \
  -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF >"$WORK/configure.log" 2>&1 ||
  { tail -30 "$WORK/configure.log" >&2; die "configuring gRPC failed"; }
ninja -C "$WORK/build" -j "$JOBS" libgrpc++.so libgrpc++_reflection.so >&2

mkdir -p "$OUT.tmp/lib"
for lib in $LIBS; do
  cp -L "$WORK/build/$lib" "$OUT.tmp/lib/$lib" || die "the build made no $lib"
  # Not grep -q: it would stop reading, and nm's SIGPIPE fails the pipe (pipefail).
  nm -D "$OUT.tmp/lib/$lib" | grep -F __tsan_func_entry >/dev/null || die "$lib is not instrumented"
done
echo "$SRC $VERSION, recipe $RECIPE, $FLAGS" >"$OUT.tmp/done"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
log "built in ${SECONDS} s: $OUT/lib"
echo "$OUT/lib"
