#!/usr/bin/env bash
# Make sure kubectl, with a Kustomize of version 5 or later inside, is installed: the tests of
# deploy/kubernetes/ render every overlay with `kubectl kustomize` (tests/deploy/). No cluster
# is contacted. Debian's own `kubernetes-client` (1.20, Kustomize 2) is too old to render
# components, `labels` and `replicas`; the `kubectl` package is taken from the machine's apt
# sources (these machines come with it).
set -euo pipefail

kustomize_major() {
  kubectl version --client -o json 2>/dev/null \
    | sed -n 's/.*"kustomizeVersion": *"v\([0-9]*\).*/\1/p'
}

if command -v kubectl >/dev/null && [ "$(kustomize_major)" -ge 5 ] 2>/dev/null; then
  exit 0
fi
echo "ensure-kubectl: installing kubectl with apt" >&2
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq kubectl >/dev/null
if ! [ "$(kustomize_major)" -ge 5 ] 2>/dev/null; then
  echo "ensure-kubectl: kubectl $(kubectl version --client 2>&1 | tr '\n' ' ') has no Kustomize 5;" \
    "install kubectl 1.27 or later" >&2
  exit 1
fi
