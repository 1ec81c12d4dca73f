#!/usr/bin/env bash
# Builds the lab's control plane from Go modules and caches the binaries per version
# outside the repository: etcd, kube-apiserver, kubectl, helm, and for real nodes kubelet,
# kube-controller-manager, kube-scheduler and containerd (with ctr and containerd-shim-runc-v2).
#
#   scripts/build-control-plane.sh          # prints the bin directory when done
#
# Cache root: $HOSTSTACK_CACHE (default /var/cache/hoststack). Each version lands in its own
# directory, so a second run is a no-op and a version bump builds beside the old one.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.6.16}
HELM_VERSION=${HELM_VERSION:-4.3.1}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-2.4.2}
CACHE=${HOSTSTACK_CACHE:-/var/cache/hoststack}
export GOFLAGS=${GOFLAGS:--mod=mod}
export GOTOOLCHAIN=local

log() { echo "[control-plane] $*" >&2; }

# The Kubernetes commands built from one wrapper module; a cached directory that lacks one of
# them (an older checkout built only the first two) gets the missing ones added.
K8S_COMMANDS="kube-apiserver kubectl kubelet kube-controller-manager kube-scheduler"

build_kubernetes() {
  local dir="$CACHE/kubernetes-v$K8S_VERSION" minor staging cmd missing=""
  for cmd in $K8S_COMMANDS; do
    [ -x "$dir/bin/$cmd" ] || missing="$missing $cmd"
  done
  [ -z "$missing" ] && return 0
  log "building$missing v$K8S_VERSION (about 5 minutes the first time)"
  mkdir -p "$dir/src" "$dir/bin"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  staging="0.${K8S_VERSION#1.}"
  if [ ! -f "$dir/src/go.mod" ]; then
    local kmod
    kmod=$(cd "$dir/src" && go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    {
      echo "module hoststack.dev/controlplane"
      echo
      echo "go $(go env GOVERSION | sed 's/^go//')"
      echo
      echo "require k8s.io/kubernetes v$K8S_VERSION"
      echo
      grep -E '^\s*k8s.io/[a-z-]+ => ./staging/' "$kmod" | awk -v v="v$staging" '{print "replace " $1 " => " $1 " " v}'
    } >"$dir/src/go.mod"
  fi
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for cmd in $K8S_COMMANDS; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; done
    printf ')\n'
  } >"$dir/src/tools.go"
  (cd "$dir/src" && go mod tidy)
  local ld="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  done
  for cmd in $missing; do
    (cd "$dir/src" && go build -ldflags "$ld" -o "$dir/bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
    mv "$dir/bin/$cmd.tmp" "$dir/bin/$cmd"
  done
}

build_etcd() {
  local dir="$CACHE/etcd-v$ETCD_VERSION"
  [ -x "$dir/bin/etcd" ] && return 0
  log "building etcd v$ETCD_VERSION"
  mkdir -p "$dir/src" "$dir/bin"
  (cd "$dir/src" && { [ -f go.mod ] || go mod init hoststack.dev/etcd >/dev/null 2>&1; } \
    && go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" \
    && go build -o "$dir/bin/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$dir/bin/etcd.tmp" "$dir/bin/etcd"
}

build_helm() {
  local dir="$CACHE/helm-v$HELM_VERSION"
  [ -x "$dir/bin/helm" ] && return 0
  log "building helm v$HELM_VERSION"
  mkdir -p "$dir/src" "$dir/bin"
  (cd "$dir/src" && { [ -f go.mod ] || go mod init hoststack.dev/helm >/dev/null 2>&1; } \
    && go get "helm.sh/helm/v4@v$HELM_VERSION" \
    && go build -o "$dir/bin/helm.tmp" helm.sh/helm/v4/cmd/helm)
  mv "$dir/bin/helm.tmp" "$dir/bin/helm"
}

# containerd for the real nodes: its own wrapper module (its dependencies differ from
# Kubernetes'), built without cgo so the binaries need nothing from the host.
CONTAINERD_COMMANDS="containerd ctr containerd-shim-runc-v2"

build_containerd() {
  local dir="$CACHE/containerd-v$CONTAINERD_VERSION" cmd missing=""
  for cmd in $CONTAINERD_COMMANDS; do
    [ -x "$dir/bin/$cmd" ] || missing="$missing $cmd"
  done
  [ -z "$missing" ] && return 0
  log "building$missing v$CONTAINERD_VERSION"
  mkdir -p "$dir/src" "$dir/bin"
  (cd "$dir/src" && { [ -f go.mod ] || go mod init hoststack.dev/containerd >/dev/null 2>&1; } \
    && go get "github.com/containerd/containerd/v2@v$CONTAINERD_VERSION")
  for cmd in $missing; do
    (cd "$dir/src" && CGO_ENABLED=0 go build -o "$dir/bin/$cmd.tmp" "github.com/containerd/containerd/v2/cmd/$cmd")
    mv "$dir/bin/$cmd.tmp" "$dir/bin/$cmd"
  done
}

mkdir -p "$CACHE/bin"
build_etcd
build_kubernetes
build_helm
build_containerd
# One directory on PATH for the lab: links to the versions this checkout asks for.
ln -sfn "$CACHE/etcd-v$ETCD_VERSION/bin/etcd" "$CACHE/bin/etcd"
for cmd in $K8S_COMMANDS; do
  ln -sfn "$CACHE/kubernetes-v$K8S_VERSION/bin/$cmd" "$CACHE/bin/$cmd"
done
for cmd in $CONTAINERD_COMMANDS; do
  ln -sfn "$CACHE/containerd-v$CONTAINERD_VERSION/bin/$cmd" "$CACHE/bin/$cmd"
done
ln -sfn "$CACHE/helm-v$HELM_VERSION/bin/helm" "$CACHE/bin/helm"
echo "$CACHE/bin"
