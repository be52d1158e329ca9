#!/usr/bin/env bash
# Makes the local Debian 12 base image the image test builds strata's Dockerfile on, for machines
# that reach Debian's mirror and PyPI but no container registry:
#
#   scripts/make_base_image.sh [TAG]      # default localhost/strata-base:bookworm
#
# debootstrap --variant=minbase bookworm, plus what a build inside it needs to reach the network the
# way this host does: the host's Debian apt sources (deb.debian.org and security, nothing else) and
# the host's CA bundle and pip.conf (a TLS-intercepting egress proxy signs PyPI's certificate with a local CA).
# Reuses the image when it already exists (about 60 s otherwise). Needs root, podman, debootstrap.
set -euo pipefail

tag=${1:-localhost/strata-base:bookworm}
if podman image exists "$tag"; then
  echo "make_base_image: $tag exists, reusing it" >&2
  exit 0
fi
mirror=${STRATA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /var/tmp/strata-base.XXXXXX)
trap 'rm -rf "$root"' EXIT

echo "make_base_image: debootstrap bookworm from $mirror into $root" >&2
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 || {
  cat "$root.log" >&2
  rm -f "$root.log"
  exit 1
}
rm -f "$root.log"

# apt: the host's Debian sources (deb822 or one-line form), only entries for debian.org mirrors.
if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
  cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/debian.sources"
  : >"$root/etc/apt/sources.list"
fi
for f in /etc/apt/apt.conf.d/99artifact-registry; do # snapshot mirrors need Check-Valid-Until off
  [[ -f $f ]] && cp "$f" "$root/etc/apt/apt.conf.d/"
done
# TLS: the host's trust store, so pip inside the build trusts what the host trusts (pip reads its own
# certifi bundle unless pip.conf names another: copy the host's pip.conf too).
[[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$root/etc/pip.conf"
mkdir -p "$root/etc/ssl/certs" "$root/usr/local/share/ca-certificates"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*

tar -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "make_base_image: imported $tag" >&2
