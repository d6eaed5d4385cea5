#!/usr/bin/env bash
# Checks deploy/ offline, with no Docker engine and no Kubernetes cluster:
#   - the compose files, with `docker compose config -q` (Compose v2) or else `docker-compose
#     config -q` (Debian 12's docker-compose 1.29, installed here with apt-get when neither exists);
#   - that the two compose files describe the same cluster apart from the workers' device and GPU
#     reservations, and the wiring that Strata needs (shared IPC and PID namespaces, fixed ports,
#     --workers matching the worker services, distinct indexes and GPUs);
#   - the Kubernetes manifests: YAML syntax, the fields each kind needs, and the same wiring (one
#     Pod sharing its process namespace, a memory-backed /dev/shm in every container, gRPC probes,
#     one GPU per worker, the Service pointing at the router); `kubectl kustomize` too when
#     kubectl is installed;
#   - deploy/Dockerfile's inputs: the files it copies exist and are not filtered out by
#     deploy/Dockerfile.dockerignore, the CMake options it passes exist; the shell scripts parse;
#   - when build/bin/ has the binaries: the runtime package list deploy/runtime-packages.sh derives
#     from them, and that apt knows every one of those packages.
# Prints "N passed, M failed" and exits non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0
failed=0
pass() { echo "ok: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# ---- tools --------------------------------------------------------------------------------
compose=()
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose)
else
  echo "check_deploy: no docker compose; installing Debian's docker-compose"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    $SUDO apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
  command -v docker-compose >/dev/null 2>&1 && compose=(docker-compose)
fi
[ ${#compose[@]} -gt 0 ] || { fail "no docker compose and docker-compose could not be installed"; }

python=python3
if ! python3 -c 'import yaml' 2>/dev/null; then
  if ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
    echo "check_deploy: installing python3-yaml"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      $SUDO apt-get install -y -qq --no-install-recommends python3-yaml >/dev/null
  fi
  python=/usr/bin/python3
fi

# ---- compose ------------------------------------------------------------------------------
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for file in deploy/docker-compose.yml deploy/docker-compose.cpu.yml; do
  [ ${#compose[@]} -gt 0 ] || break
  if out=$("${compose[@]}" -f "$file" config -q 2>&1); then
    pass "${compose[*]} -f $file config -q"
  else
    fail "${compose[*]} -f $file config -q: $out"
  fi
  # The resolved form, for the checks below (defaults of every ${VAR:-default} applied).
  "${compose[@]}" -f "$file" config >"$tmp/$(basename "$file" .yml).resolved.yml" 2>/dev/null
done

# ---- structure: compose and Kubernetes -----------------------------------------------------
"$python" - "$tmp" >"$tmp/structure.out" 2>&1 <<'EOF'
import os, re, sys
import yaml

tmp = sys.argv[1]
results = []
def check(ok, what):
    results.append((bool(ok), what))

def flag(args, name):
    """Value of --name=VALUE (or --name VALUE) in an argument list, else None."""
    for i, a in enumerate(args):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
        if a == f"--{name}" and i + 1 < len(args):
            return args[i + 1]
    return None

# --- compose: the files as written (YAML syntax, anchors) and as Compose resolved them.
def load_compose(name):
    raw = yaml.safe_load(open(f"deploy/{name}.yml"))
    path = os.path.join(tmp, f"{name}.resolved.yml")
    resolved = yaml.safe_load(open(path)) if os.path.exists(path) and os.path.getsize(path) else None
    return raw, resolved

def compose_checks(name, gpu):
    raw, resolved = load_compose(name)
    check(isinstance(raw, dict) and "services" in raw, f"{name}: YAML with services")
    doc = resolved or raw
    services = doc.get("services", {})
    for s in ("shm", "cache", "router"):
        check(s in services, f"{name}: service {s}")
    workers = sorted(s for s in services if re.fullmatch(r"worker-\d+", s))
    check(workers, f"{name}: worker services ({', '.join(workers)})")
    shm = services.get("shm", {})
    check(shm.get("ipc") == "shareable", f"{name}: shm has ipc: shareable")
    check("shm_size" in shm, f"{name}: shm sets shm_size")
    check(shm.get("init") is True, f"{name}: shm runs an init (reaps orphans of the shared PID namespace)")
    check("build" in shm, f"{name}: shm builds the image")
    images = {s: v.get("image") for s, v in services.items()}
    check(len(set(images.values())) == 1, f"{name}: every service uses one image ({set(images.values())})")
    for s in ["cache", "router"] + workers:
        v = services.get(s, {})
        check(v.get("ipc") == "service:shm", f"{name}: {s} joins shm's IPC namespace")
        check(v.get("pid") == "service:shm", f"{name}: {s} joins shm's PID namespace")
        check(v.get("restart") == "unless-stopped", f"{name}: {s} restart: unless-stopped")
        mounts = [m for m in v.get("volumes", []) if isinstance(m, dict)]
        check(any(m.get("target") == "/models/model" and m.get("read_only") for m in mounts),
              f"{name}: {s} mounts the model read-only at /models/model")
        check(any(a.startswith("--log-level=") for a in v.get("command", [])),
              f"{name}: {s} passes --log-level")
    cache = services.get("cache", {}).get("command", [])
    router = services.get("router", {}).get("command", [])
    check(cache[:1] == ["strata-cache"] and flag(cache, "listen") == "0.0.0.0:50052",
          f"{name}: cache listens on 0.0.0.0:50052")
    check(router[:1] == ["strata-router"] and flag(router, "listen") == "0.0.0.0:50051",
          f"{name}: router listens on 0.0.0.0:50051")
    check(flag(router, "workers") == str(len(workers)),
          f"{name}: router --workers={flag(router, 'workers')} matches {len(workers)} worker services")
    ports = services.get("router", {}).get("ports", [])
    check(any(str(p.get("target") if isinstance(p, dict) else p).endswith("50051") for p in ports),
          f"{name}: router port 50051 published")
    check("healthcheck" in services.get("cache", {}) and "healthcheck" in services.get("router", {}),
          f"{name}: cache and router have health checks")
    indexes, gpus = [], []
    for w in workers:
        v = services[w]
        cmd = v.get("command", [])
        check(cmd[:1] == ["strata-worker"], f"{name}: {w} runs strata-worker")
        check(flag(cmd, "cache") == "cache:50052" and flag(cmd, "router") == "router:50051",
              f"{name}: {w} reaches cache:50052 and router:50051 by service name")
        check(flag(cmd, "transport") in (None, "shm"), f"{name}: {w} uses the shm transport")
        indexes.append(flag(cmd, "index"))
        devices = (v.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", []))
        if gpu:
            check(len(devices) == 1 and devices[0].get("capabilities") == ["gpu"]
                  and len(devices[0].get("device_ids", [])) == 1,
                  f"{name}: {w} reserves exactly one GPU")
            gpus += [d for dev in devices for d in dev.get("device_ids", [])]
        else:
            check(not devices, f"{name}: {w} reserves no GPU")
            check(flag(cmd, "device") == "cpu", f"{name}: {w} runs on --device=cpu")
    check(sorted(indexes) == [str(i) for i in range(len(workers))],
          f"{name}: worker indexes are 0..{len(workers) - 1} ({indexes})")
    if gpu:
        check(len(gpus) == len(set(gpus)) == len(workers), f"{name}: one distinct GPU per worker ({gpus})")
    return doc

gpu_doc = compose_checks("docker-compose", gpu=True)
cpu_doc = compose_checks("docker-compose.cpu", gpu=False)

def strip_gpu(doc):
    """The GPU file with its GPU specifics replaced by the CPU ones."""
    doc = yaml.safe_load(yaml.safe_dump(doc))
    for name, v in doc.get("services", {}).items():
        if re.fullmatch(r"worker-\d+", name):
            v.pop("deploy", None)
            v["command"] = [re.sub(r"^--device=.*", "--device=cpu", a) for a in v.get("command", [])]
    return doc
same = strip_gpu(gpu_doc) == strip_gpu(cpu_doc)
if not same:
    a, b = strip_gpu(gpu_doc)["services"], strip_gpu(cpu_doc)["services"]
    diff = sorted(s for s in set(a) | set(b) if a.get(s) != b.get(s))
check(same, "docker-compose.yml and docker-compose.cpu.yml differ only in the workers' device and GPUs"
      + ("" if same else f" (differing services: {diff})"))

# --- Kubernetes.
REQUIRED = {
    "ConfigMap": ["metadata.name"],
    "Deployment": ["metadata.name", "spec.selector.matchLabels", "spec.template.metadata.labels",
                   "spec.template.spec.containers"],
    "Service": ["metadata.name", "spec.selector", "spec.ports"],
    "Kustomization": ["resources"],
}
API = {"ConfigMap": "v1", "Deployment": "apps/v1", "Service": "v1",
       "Kustomization": "kustomize.config.k8s.io/v1beta1"}

def get(d, path):
    for key in path.split("."):
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d

docs = []
for root, _, files in os.walk("deploy/k8s"):
    for f in sorted(files):
        if not f.endswith((".yaml", ".yml")):
            continue
        path = os.path.join(root, f)
        try:
            loaded = [d for d in yaml.safe_load_all(open(path)) if d is not None]
            check(True, f"{path}: YAML parses ({len(loaded)} document(s))")
        except yaml.YAMLError as e:
            check(False, f"{path}: YAML: {e}")
            continue
        for d in loaded:
            kind = d.get("kind")
            check(kind in API and d.get("apiVersion") == API.get(kind),
                  f"{path}: {kind} has apiVersion {d.get('apiVersion')}")
            for field in REQUIRED.get(kind, []):
                check(get(d, field) not in (None, [], {}), f"{path}: {kind} has {field}")
            docs.append((path, d))

kust = [d for _, d in docs if d.get("kind") == "Kustomization"]
for k in kust:
    for r in k.get("resources", []):
        check(os.path.exists(os.path.join("deploy/k8s", r)), f"kustomization: resource {r} exists")

config = {}
for _, d in docs:
    if d.get("kind") == "ConfigMap":
        config.update(d.get("data", {}))
deployments = [d for _, d in docs if d.get("kind") == "Deployment"]
services = [d for _, d in docs if d.get("kind") == "Service"]
check(len(deployments) == 1, "k8s: one Deployment")
for dep in deployments:
    spec = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in dep["spec"]["selector"]["matchLabels"].items()),
          "k8s: Deployment selector matches its Pod labels")
    check(dep["spec"].get("replicas", 1) == 1 and get(dep, "spec.strategy.type") == "Recreate",
          "k8s: one replica, Recreate")
    check(spec.get("shareProcessNamespace") is True, "k8s: shareProcessNamespace: true")
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    dshm = [n for n, v in vols.items() if get(v, "emptyDir.medium") == "Memory"]
    check(len(dshm) == 1, "k8s: one memory-backed emptyDir for /dev/shm")
    check(get(spec, "securityContext.runAsUser") is not None, "k8s: one uid for every container")
    containers = {c["name"]: c for c in spec["containers"]}
    for name in ("cache", "router"):
        check(name in containers, f"k8s: container {name}")
    workers = sorted(n for n in containers if re.fullmatch(r"worker-\d+", n))
    check(workers, f"k8s: worker containers ({', '.join(workers)})")
    check(len({c.get("image") for c in containers.values()}) == 1, "k8s: one image for every container")
    for n, c in containers.items():
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        check(mounts.get("/dev/shm", {}).get("name") in dshm, f"k8s: {n} mounts the memory emptyDir at /dev/shm")
        check(mounts.get("/models/model", {}).get("readOnly") is True, f"k8s: {n} mounts the model read-only")
        check(mounts.get("/models/model", {}).get("name") in vols, f"k8s: {n}'s model volume exists")
        for a in c.get("command", []) + c.get("args", []):
            for var in re.findall(r"\$\((\w+)\)", a):
                known = var in config or any(e.get("name") == var for e in c.get("env", []))
                check(known, f"k8s: {n}: $({var}) is defined")
    cache, router = containers.get("cache", {}), containers.get("router", {})
    ccmd, rcmd = cache.get("command", []), router.get("command", [])
    check(flag(ccmd, "listen") == "0.0.0.0:50052", "k8s: cache listens on 50052")
    check(flag(rcmd, "listen") == "0.0.0.0:50051", "k8s: router listens on 50051")
    check(flag(rcmd, "workers") == str(len(workers)),
          f"k8s: router --workers={flag(rcmd, 'workers')} matches {len(workers)} worker containers")
    check(get(router, "readinessProbe.grpc.port") == 50051, "k8s: router readiness is the gRPC health on 50051")
    check(get(router, "livenessProbe.tcpSocket.port") == 50051,
          "k8s: router liveness is a TCP check (gRPC health is NOT_SERVING while a worker restarts)")
    check(get(cache, "livenessProbe.grpc.port") == 50052 or get(cache, "startupProbe.grpc.port") == 50052,
          "k8s: cache has a gRPC probe on 50052")
    rports = {p.get("name"): p["containerPort"] for p in router.get("ports", [])}
    indexes = []
    for w in workers:
        cmd = containers[w].get("command", [])
        indexes.append(flag(cmd, "index"))
        check(flag(cmd, "cache") == "127.0.0.1:50052" and flag(cmd, "router") == "127.0.0.1:50051",
              f"k8s: {w} reaches the cache and router on localhost")
        check(str((get(containers[w], "resources.limits") or {}).get("nvidia.com/gpu")) == "1",
              f"k8s: {w} limits nvidia.com/gpu: 1")
    check(sorted(indexes) == [str(i) for i in range(len(workers))], f"k8s: worker indexes 0..{len(workers) - 1}")
    for svc in services:
        check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
              f"k8s: Service {svc['metadata']['name']} selects the Pod")
        for p in svc["spec"]["ports"]:
            t = p.get("targetPort")
            check(t in rports or t in rports.values(), f"k8s: Service port {p.get('name')} targets the router ({t})")

for ok, what in results:
    print(("ok: " if ok else "FAIL: ") + what)
sys.exit(0 if all(ok for ok, _ in results) else 1)
EOF
structure_status=$?
cat "$tmp/structure.out"
passed=$((passed + $(grep -c '^ok: ' "$tmp/structure.out")))
failed=$((failed + $(grep -c '^FAIL: ' "$tmp/structure.out")))
if [ $structure_status -ne 0 ] && ! grep -q '^FAIL: ' "$tmp/structure.out"; then
  fail "the structure checks crashed (see above)"
fi

if command -v kubectl >/dev/null 2>&1; then
  if out=$(kubectl kustomize deploy/k8s 2>&1 >/dev/null); then
    pass "kubectl kustomize deploy/k8s"
  else
    fail "kubectl kustomize deploy/k8s: $out"
  fi
fi

# ---- Dockerfile inputs ----------------------------------------------------------------------
# Every COPY source from the build context exists and survives the .dockerignore (whose entries
# here are plain top-level names or **/ globs).
ignored() {
  local path=$1 pattern
  while read -r pattern; do
    case $pattern in ''|'#'*) continue ;; esac
    case $pattern in
      '**/'*) [[ /$path == */${pattern#**/} || /$path == */${pattern#**/}/* ]] && return 0 ;;
      *) [[ $path == $pattern || $path == $pattern/* ]] && return 0 ;;
    esac
  done < deploy/Dockerfile.dockerignore
  return 1
}
while read -r src; do
  [ "$src" = . ] && continue
  if [ ! -e "$src" ]; then
    fail "Dockerfile copies $src, which does not exist"
  elif ignored "$src"; then
    fail "Dockerfile copies $src, which deploy/Dockerfile.dockerignore filters out"
  else
    pass "Dockerfile input $src is in the build context"
  fi
done < <(grep -E '^COPY ' deploy/Dockerfile | grep -v -- '--from=' | awk '{for (i = 2; i < NF; i++) print $i}')
for needed in scripts/build.sh deploy/runtime-packages.sh CMakeLists.txt proto common services tools; do
  if ignored "$needed"; then fail "the build needs $needed, which the .dockerignore filters out"
  else pass "the build context keeps $needed"; fi
done
for option in STRATA_BUILD_TESTS STRATA_CUDA; do
  if grep -rqE "(option\(|set\()$option\b" CMakeLists.txt cmake/; then
    pass "CMake option $option (passed by the Dockerfile) exists"
  else
    fail "CMake option $option (passed by the Dockerfile) is not defined"
  fi
done
# (scripts/check_scripts.sh parses every script of the tree.)
for script in deploy/healthcheck.sh deploy/runtime-packages.sh scripts/check_deploy.sh; do
  if [ -x "$script" ]; then pass "$script is executable"
  else fail "$script is not executable"; fi
done

# ---- runtime packages (needs a build) ---------------------------------------------------------
bins=(build/bin/strata build/bin/strata-cache build/bin/strata-worker build/bin/strata-router)
if [ -x build/bin/strata-router ] && [ -x build/bin/strata-worker ] && [ -x build/bin/strata-cache ] && [ -x build/bin/strata ]; then
  if packages=$(deploy/runtime-packages.sh "${bins[@]}" 2>"$tmp/rp.err"); then
    pass "runtime packages of build/bin: $(echo $packages)"
    missing=()
    for p in $packages; do
      apt-cache show "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then pass "apt knows every runtime package"
    else fail "apt does not know ${missing[*]} (run apt-get update?)"; fi
  else
    fail "deploy/runtime-packages.sh: $(cat "$tmp/rp.err")"
  fi
else
  echo "skip: no build/bin binaries, so the runtime package list was not derived"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
