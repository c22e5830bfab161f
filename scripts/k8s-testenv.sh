#!/usr/bin/env bash
# A real Kubernetes control plane (etcd + kube-apiserver, no kubelet) on loopback, for the
# operator's integration tests.
#
#   scripts/k8s-testenv.sh build    build/install and cache kube-apiserver, helm, etcd, kubectl
#   scripts/k8s-testenv.sh start    start etcd + kube-apiserver (RBAC on), write env + kubeconfig
#   scripts/k8s-testenv.sh stop     stop them and remove the state directory
#   scripts/k8s-testenv.sh env      print the env file path of a running environment
#
# Binaries are cached in $STREAMSCALE_K8S_CACHE (default ~/.cache/streamscale/k8s): a second
# `build` reuses them. kube-apiserver is built from the Go module proxy's k8s.io/kubernetes
# through a small wrapper module whose go.mod pins every k8s.io/* staging module to the
# matching v0.x version. helm comes from `go install`, etcd, kubectl and prometheus from Debian.
#
# `start` writes $STATE/env (default state dir /tmp/streamscale-k8s-$UID) with
# KUBE_APISERVER_URL, KUBE_ADMIN_TOKEN, KUBE_CA_FILE, KUBECONFIG, HELM, KUBECTL, PROMETHEUS; the admin user
# authenticates with a static bearer token and is in group system:masters.
set -euo pipefail

K8S_VERSION="${STREAMSCALE_K8S_VERSION:-1.34.4}"
HELM_VERSION="${STREAMSCALE_HELM_VERSION:-v3.19.5}"
CACHE="${STREAMSCALE_K8S_CACHE:-$HOME/.cache/streamscale/k8s}"
STATE="${STREAMSCALE_K8S_STATE:-/tmp/streamscale-k8s-$(id -u)}"
BIN="$CACHE/bin"
APISERVER="$BIN/kube-apiserver-v$K8S_VERSION"
HELM_BIN="$BIN/helm-$HELM_VERSION"

log() { echo "k8s-testenv: $*" >&2; }

ensure_apt() {
  local missing=()
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v kubectl >/dev/null || missing+=(kubernetes-client)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v curl >/dev/null || missing+=(curl)
  # A real Prometheus server for the operator's Prometheus metrics source (not started here:
  # the tests start their own on loopback).
  command -v prometheus >/dev/null || missing+=(prometheus)
  if ((${#missing[@]})); then
    log "installing ${missing[*]} with apt"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

build_apiserver() {
  if [[ -x "$APISERVER" ]]; then
    log "cached: $APISERVER"
    return
  fi
  command -v go >/dev/null || { log "error: go is not installed"; exit 1; }
  local t0=$SECONDS src="$CACHE/src/apiserver-v$K8S_VERSION"
  mkdir -p "$src" "$BIN"
  log "building kube-apiserver v$K8S_VERSION (slow on a fresh machine)"
  # Download the module to read its staging replace list.
  local dir
  dir=$(cd "$src" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" |
    sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  [[ -d "$dir" ]] || { log "error: could not download k8s.io/kubernetes@v$K8S_VERSION"; exit 1; }
  local minor="${K8S_VERSION#*.}"
  {
    echo "module streamscale.dev/k8s-testenv-apiserver"
    echo
    echo "go 1.24"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$dir/go.mod" |
      sed -E "s#^\s*(k8s\.io/[a-z0-9-]+) => .*#replace \1 => \1 v0.$minor#"
  } >"$src/go.mod"
  cat >"$src/tools.go" <<'EOF'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
EOF
  (
    cd "$src"
    GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || true
    GOFLAGS=-mod=mod go get "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" >/dev/null
    local v=k8s.io/component-base/version cv=k8s.io/client-go/pkg/version
    local ld="-s -w -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=${minor%%.*}"
    ld+=" -X $cv.gitVersion=v$K8S_VERSION -X $cv.gitMajor=1 -X $cv.gitMinor=${minor%%.*}"
    GOFLAGS=-mod=mod go build -trimpath -ldflags "$ld" -o "$APISERVER.tmp" k8s.io/kubernetes/cmd/kube-apiserver
  )
  mv "$APISERVER.tmp" "$APISERVER"
  log "built kube-apiserver in $((SECONDS - t0)) s"
}

build_helm() {
  if [[ -x "$HELM_BIN" ]]; then
    log "cached: $HELM_BIN"
    return
  fi
  local t0=$SECONDS tmp="$CACHE/src/helm-gobin"
  mkdir -p "$tmp" "$BIN"
  log "installing helm $HELM_VERSION with go install"
  GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$tmp/helm" "$HELM_BIN"
  log "installed helm in $((SECONDS - t0)) s"
}

cmd_build() {
  ensure_apt
  build_apiserver &
  local a=$!
  build_helm &
  local h=$!
  wait "$a"
  wait "$h"
}

wait_ready() {
  local url=$1 what=$2 tries=${3:-120}
  for ((i = 0; i < tries; i++)); do
    if curl -fsk --max-time 2 "${@:4}" "$url" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  log "error: $what did not become ready at $url; see $STATE/*.log"
  tail -n 30 "$STATE"/*.log >&2 || true
  return 1
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

cmd_start() {
  [[ -x "$APISERVER" && -x "$HELM_BIN" ]] || cmd_build
  ensure_apt
  if [[ -f "$STATE/env" ]] && curl -fsk --max-time 2 "$(sed -n 's/^KUBE_APISERVER_URL=//p' "$STATE/env")/readyz" \
    -H "Authorization: Bearer $(sed -n 's/^KUBE_ADMIN_TOKEN=//p' "$STATE/env")" >/dev/null 2>&1; then
    log "already running; env in $STATE/env"
    echo "$STATE/env"
    return
  fi
  cmd_stop >/dev/null 2>&1 || true
  mkdir -p "$STATE/pki" "$STATE/etcd"
  local pki="$STATE/pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=streamscale-testenv-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" >/dev/null 2>&1
  cat >"$pki/san.cnf" <<EOF
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc,IP:10.0.0.1
EOF
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$pki/apiserver.key" \
    -out "$pki/apiserver.csr" >/dev/null 2>&1
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/san.cnf" -out "$pki/apiserver.crt" >/dev/null 2>&1
  openssl genrsa -out "$pki/sa.key" 2048 >/dev/null 2>&1
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" >/dev/null 2>&1
  local token
  token=$(openssl rand -hex 24)
  echo "$token,admin,admin,system:masters" >"$pki/tokens.csv"

  local etcd_port etcd_peer api_port
  etcd_port=$(free_port)
  etcd_peer=$(free_port)
  api_port=$(free_port)
  ETCD_UNSUPPORTED_ARCH="" setsid etcd --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "default=http://127.0.0.1:$etcd_peer" --name default \
    >"$STATE/etcd.log" 2>&1 </dev/null &
  echo $! >"$STATE/etcd.pid"
  wait_ready "http://127.0.0.1:$etcd_port/health" etcd 60

  # Webhooks are off (nothing would serve them); ValidatingAdmissionPolicy (CEL, in the API
  # server) stays on: a test refuses the operator's Deployment with one.
  setsid "$APISERVER" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --cert-dir "$pki" --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
    --authorization-mode RBAC --anonymous-auth=false \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=false \
    --enable-admission-plugins NamespaceLifecycle,ServiceAccount \
    --disable-admission-plugins ValidatingAdmissionWebhook,MutatingAdmissionWebhook \
    --endpoint-reconciler-type none \
    >"$STATE/apiserver.log" 2>&1 </dev/null &
  echo $! >"$STATE/apiserver.pid"
  local url="https://127.0.0.1:$api_port"
  wait_ready "$url/readyz" kube-apiserver 240 -H "Authorization: Bearer $token"

  cat >"$STATE/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster: {server: "$url", certificate-authority: "$pki/ca.crt"}
users:
- name: admin
  user: {token: "$token"}
contexts:
- name: testenv
  context: {cluster: testenv, user: admin, namespace: default}
current-context: testenv
EOF
  cat >"$STATE/env" <<EOF
KUBE_APISERVER_URL=$url
KUBE_ADMIN_TOKEN=$token
KUBE_CA_FILE=$pki/ca.crt
KUBECONFIG=$STATE/kubeconfig
HELM=$HELM_BIN
KUBECTL=$(command -v kubectl || true)
PROMETHEUS=$(command -v prometheus || true)
EOF
  # The default ServiceAccount's namespace must exist before anything is created in it.
  for _ in $(seq 1 60); do
    curl -fsk --max-time 2 -H "Authorization: Bearer $token" "$url/api/v1/namespaces/default" >/dev/null 2>&1 && break
    sleep 0.5
  done
  log "running at $url; env in $STATE/env"
  echo "$STATE/env"
}

stop_pid() {
  local f=$1
  [[ -f "$f" ]] || return 0
  local pid
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

cmd_stop() {
  stop_pid "$STATE/apiserver.pid"
  stop_pid "$STATE/etcd.pid"
  rm -rf "$STATE"
  log "stopped"
}

case "${1:-}" in
  build) cmd_build ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  env) [[ -f "$STATE/env" ]] && echo "$STATE/env" ;;
  *)
    echo "usage: $0 build|start|stop|env" >&2
    exit 2
    ;;
esac
