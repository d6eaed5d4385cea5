#!/usr/bin/env bash
# Checks deploy/ offline, with no Docker engine and no Kubernetes cluster:
#   - the compose files, with `docker compose config -q` (Compose v2) or else `docker-compose
#     config -q` (Debian 12's docker-compose 1.29, installed here with apt-get when neither exists);
#     STRATA_COMPOSE="path/to/docker-compose" picks another Compose binary. They run with a dummy
#     STRATA_CLUSTER_TOKEN (never the operator's), and once without one, which must fail;
#   - the wiring that Strata needs in both compose files (shared IPC and PID namespaces, fixed
#     ports, the router's internal listener on 0.0.0.0:50053 and the workers' --router pointing
#     at it, the router serving HTTP (--http-port), no port published but the client port 50051
#     and that HTTP port, the router's and the expert store's health checks on the gRPC health RPC
#     (strata-healthcheck grpc), a memory limit on every service and a CPU limit on every strata
#     process, the router's --threads within its CPU limit, the model mounted read-only where
#     --model points, the cluster token required from the environment in the expert store, the router
#     and every worker, --workers matching the worker services, distinct indexes,
#     restart: unless-stopped, --max-batch-tokens agreeing);
#   - the GPU file's GPU path: it builds the CUDA variant, the router runs on cuda:0, every GPU
#     container (mps, router, workers) reserves the same GPUs, worker i runs on one of them
#     (a distinct one per worker while there are enough), an MPS control daemon service with a
#     health check that the router and the workers wait for, sharing its pipe directory with
#     them; and that the two files differ in nothing but those GPU parts;
#   - the Kubernetes manifests of deploy/k8s/ (CPU) and deploy/k8s/gpu/ (GPU path): YAML syntax,
#     the fields each kind needs, the same wiring (one Pod sharing its process namespace, a
#     memory-backed /dev/shm in every container, gRPC probes, the Service pointing at the
#     router's client port, the router's internal listener on 127.0.0.1:50053 and the workers'
#     --router on it, in no Service and no containerPort, the router's --http-port as a
#     containerPort named http and a Service port named http, prometheus.io/scrape, port and
#     path annotations on the Pod and the Service, CPU and memory requests and limits (limits not
#     below requests) on every container, the model mounted read-only where --model points,
#     the cluster token from one Secret
#     (secretKeyRef, never a literal) in the expert store, the router and every worker), no GPUs in the
#     CPU one, and in the GPU one one ResourceClaim referenced by the mps
#     sidecar, the router and every worker, with a GPU per worker; `kubectl kustomize` too when
#     kubectl is installed, and `kubernetes-validate --strict` (Kubernetes 1.34 schemas) when
#     that is installed;
#   - deploy/Dockerfile: the build arguments the compose files pass and the ones it documents are
#     declared, both variants' stages exist, the files it copies exist and are not filtered out by
#     deploy/Dockerfile.dockerignore, the CMake options it passes exist; the scripts are executable;
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
if [ -n "${STRATA_COMPOSE:-}" ]; then
  compose=("$STRATA_COMPOSE")
elif docker compose version >/dev/null 2>&1; then
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
[ ${#compose[@]} -eq 0 ] || echo "check_deploy: $("${compose[@]}" version 2>/dev/null | head -1)"

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
# The compose files require STRATA_CLUSTER_TOKEN (${STRATA_CLUSTER_TOKEN:?...}). The static
# checks use a dummy one, whatever the caller's environment holds, so that they pass where the
# operator has set none and never copy a real token into $tmp.
export CHECK_DEPLOY_TOKEN=check-deploy-dummy-cluster-token-0123456789abcdef
for file in deploy/docker-compose.yml deploy/docker-compose.cpu.yml; do
  [ ${#compose[@]} -gt 0 ] || break
  if out=$(STRATA_CLUSTER_TOKEN=$CHECK_DEPLOY_TOKEN "${compose[@]}" -f "$file" config -q 2>&1); then
    pass "${compose[*]} -f $file config -q"
  else
    fail "${compose[*]} -f $file config -q: $out"
  fi
  # The resolved form, for the checks below (defaults of every ${VAR:-default} applied).
  STRATA_CLUSTER_TOKEN=$CHECK_DEPLOY_TOKEN "${compose[@]}" -f "$file" config \
    >"$tmp/$(basename "$file" .yml).resolved.yml" 2>/dev/null
  # Without a token (and no .env file) compose must refuse, naming the variable. (A successful
  # `config -q` prints nothing; the pip-packaged Compose v2 wrapper exits 0 even on errors.)
  : >"$tmp/empty.env"
  out=$(env -u STRATA_CLUSTER_TOKEN "${compose[@]}" --env-file "$tmp/empty.env" -f "$file" config -q 2>&1)
  if grep -q 'STRATA_CLUSTER_TOKEN' <<<"$out"; then
    pass "$file: compose refuses to run without STRATA_CLUSTER_TOKEN"
  else
    fail "$file: compose runs without STRATA_CLUSTER_TOKEN (${out:-no error})"
  fi
done

# The Dockerfile's build arguments (ARG NAME[=default]), for the structure checks.
grep -E '^[[:space:]]*ARG[[:space:]]' deploy/Dockerfile | sed -E 's/^[[:space:]]*ARG[[:space:]]+([A-Za-z_][A-Za-z0-9_]*).*/\1/' \
  | sort -u >"$tmp/dockerfile-args.txt"

# ---- structure: compose and Kubernetes -----------------------------------------------------
"$python" - "$tmp" >"$tmp/structure.out" 2>&1 <<'EOF'
import os, re, sys
import yaml

tmp = sys.argv[1]
dockerfile_args = set(open(os.path.join(tmp, "dockerfile-args.txt")).read().split())
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

def cuda_index(device):
    m = re.fullmatch(r"cuda:(\d+)", device or "")
    return int(m.group(1)) if m else None

# --- compose: the files as written (YAML syntax, anchors) and as Compose resolved them.
def load_compose(name):
    raw = yaml.safe_load(open(f"deploy/{name}.yml"))
    path = os.path.join(tmp, f"{name}.resolved.yml")
    resolved = yaml.safe_load(open(path)) if os.path.exists(path) and os.path.getsize(path) else None
    return raw, resolved

def env_of(service):
    env = service.get("environment", {}) or {}
    if isinstance(env, list):  # KEY=VALUE entries
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    return env

def reservation(service):
    devices = (service.get("deploy", {}) or {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return devices or []

def depends(service):
    d = service.get("depends_on", {}) or {}
    if isinstance(d, list):
        return {k: "service_started" for k in d}
    return {k: (v or {}).get("condition", "service_started") for k, v in d.items()}

def get_path(d, path):
    for key in path.split("."):
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d

def mounts_of(service):
    return [m for m in service.get("volumes", []) if isinstance(m, dict)]

def port_targets(service):
    """The container ports a service publishes (short "HOST:CONTAINER[/proto]" or long form)."""
    targets = []
    for p in service.get("ports", []) or []:
        t = p.get("target") if isinstance(p, dict) else str(p).split("/")[0].rsplit(":", 1)[-1]
        targets.append(str(t))
    return targets

TOKEN = "STRATA_CLUSTER_TOKEN"
DUMMY_TOKEN = os.environ.get("CHECK_DEPLOY_TOKEN")
REQUIRED_TOKEN = re.compile(r"\$\{STRATA_CLUSTER_TOKEN:\?[^}]+\}")

def compose_checks(name, gpu):
    raw, resolved = load_compose(name)
    check(isinstance(raw, dict) and "services" in raw, f"{name}: YAML with services")
    doc = resolved or raw
    services = doc.get("services", {})
    expected = ("shm", "expert-store", "router") + (("mps",) if gpu else ())
    for s in expected:
        check(s in services, f"{name}: service {s}")
    if not gpu:
        check("mps" not in services, f"{name}: no mps service")
    workers = sorted((s for s in services if re.fullmatch(r"worker-\d+", s)), key=lambda w: int(w[7:]))
    check(workers, f"{name}: worker services ({', '.join(workers)})")
    check(set(services) == set(expected) | set(workers),
          f"{name}: no other services ({sorted(set(services) - set(expected) - set(workers))})")
    shm = services.get("shm", {})
    check(shm.get("ipc") == "shareable", f"{name}: shm has ipc: shareable")
    check("shm_size" in shm, f"{name}: shm sets shm_size")
    check(shm.get("init") is True, f"{name}: shm runs an init (reaps orphans of the shared PID namespace)")
    build = shm.get("build", {}) or {}
    check(build, f"{name}: shm builds the image")
    check(build.get("dockerfile") == "deploy/Dockerfile", f"{name}: built from deploy/Dockerfile")
    args = build.get("args", {}) or {}
    if isinstance(args, list):
        args = dict(a.split("=", 1) for a in args)
    variant = "cuda" if gpu else "cpu"
    check(args.get("VARIANT") == variant, f"{name}: builds the {variant} variant (VARIANT={args.get('VARIANT')})")
    raw_variant = (((raw.get("services", {}).get("shm", {}) or {}).get("build", {}) or {}).get("args", {}) or {}).get("VARIANT")
    check(raw_variant == variant, f"{name}: VARIANT is {variant} as written, not a setting ({raw_variant})")
    for arg in args:
        check(arg in dockerfile_args, f"{name}: build argument {arg} is an ARG of deploy/Dockerfile")
    if gpu:
        check("CUDA_ARCHITECTURES" in args and "CUDA_VERSION" in args,
              f"{name}: passes CUDA_VERSION and CUDA_ARCHITECTURES")
    images = {s: v.get("image") for s, v in services.items()}
    check(len(set(images.values())) == 1, f"{name}: every service uses one image ({set(images.values())})")
    for s in ["expert-store", "router"] + workers + (["mps"] if gpu else []):
        v = services.get(s, {})
        check(v.get("ipc") == "service:shm", f"{name}: {s} joins shm's IPC namespace")
        check(v.get("pid") == "service:shm", f"{name}: {s} joins shm's PID namespace")
        check(v.get("restart") == "unless-stopped", f"{name}: {s} restart: unless-stopped")
        if s == "mps":
            continue
        model_dir = flag(v.get("command", []), "model")
        check(model_dir and model_dir.startswith("/models/")
              and any(m.get("target") == model_dir and m.get("read_only") for m in mounts_of(v)),
              f"{name}: {s} mounts the model read-only where its --model={model_dir} points, under /models/")
        check(any(a.startswith("--log-level=") for a in v.get("command", [])),
              f"{name}: {s} passes --log-level")
    store = services.get("expert-store", {}).get("command", [])
    router_service = services.get("router", {})
    router = router_service.get("command", [])
    check(store[:1] == ["strata-expert-store"] and flag(store, "listen") == "0.0.0.0:50052",
          f"{name}: expert-store listens on 0.0.0.0:50052")
    check(router[:1] == ["strata-router"] and flag(router, "listen") == "0.0.0.0:50051",
          f"{name}: router listens on 0.0.0.0:50051 (clients)")
    internal = flag(router, "internal-listen")
    check(internal == "0.0.0.0:50053",
          f"{name}: router's internal listener (Coordinator, Admin) on --internal-listen=0.0.0.0:50053 ({internal})")
    check(flag(router, "workers") == str(len(workers)),
          f"{name}: router --workers={flag(router, 'workers')} matches {len(workers)} worker services")
    http_port = flag(router, "http-port")
    check(http_port is not None and http_port.isdigit() and 0 < int(http_port) < 65536
          and http_port not in ("50051", "50052", "50053"),
          f"{name}: router serves the HTTP API and /metrics (--http-port={http_port})")
    check(sorted(port_targets(router_service)) == sorted(["50051", str(http_port)]),
          f"{name}: the router publishes its client port 50051 and its HTTP port {http_port}, nothing else"
          f" ({port_targets(router_service)})")
    published = {s: port_targets(v) for s, v in services.items() if s != "router" and port_targets(v)}
    check(not published, f"{name}: no other service publishes a port ({published})")
    check("healthcheck" in services.get("expert-store", {}) and "healthcheck" in router_service,
          f"{name}: expert-store and router have health checks")
    # Both use the standard gRPC health RPC (strata-healthcheck grpc): on the router's client
    # port it is SERVING once every worker has registered; on the store's, once it has loaded.
    test = (router_service.get("healthcheck", {}) or {}).get("test", [])
    check(test == ["CMD", "strata-healthcheck", "grpc", "127.0.0.1:50051"],
          f"{name}: the router's health check is grpc.health.v1 on its client port ({test[1:]})")
    test = (services.get("expert-store", {}).get("healthcheck", {}) or {}).get("test", [])
    check(test == ["CMD", "strata-healthcheck", "grpc", "127.0.0.1:50052"],
          f"{name}: the expert store's health check is grpc.health.v1 on 50052 ({test[1:]})")
    # Resource limits: memory for every container, a CPU quota for every strata process.
    def limit(v, key):
        value = v.get(key)
        if value in (None, "", 0, "0"):
            value = get_path(v, f"deploy.resources.limits.{'memory' if key == 'mem_limit' else 'cpus'}")
        return value
    for s, v in services.items():
        check(limit(v, "mem_limit") not in (None, "", 0, "0"), f"{name}: {s} has a memory limit ({limit(v, 'mem_limit')})")
        if s != "shm":
            check(limit(v, "cpus") not in (None, "", 0, "0"), f"{name}: {s} has a CPU limit ({limit(v, 'cpus')})")
    threads = flag(router, "threads")
    cpus = limit(router_service, "cpus")
    try:
        fits = threads is not None and int(threads) > 0 and float(cpus) >= int(threads)
    except (TypeError, ValueError):
        fits = False
    check(fits, f"{name}: the router's --threads={threads} fits its CPU limit ({cpus})")
    # The cluster token: required from the environment (not written in the file), in every
    # strata process's container.
    raw_services = raw.get("services", {}) or {}
    for s in ["expert-store", "router"] + workers:
        written = env_of(raw_services.get(s, {}) or {}).get(TOKEN)
        check(isinstance(written, str) and REQUIRED_TOKEN.fullmatch(written),
              f"{name}: {s} requires {TOKEN} from the environment (${{{TOKEN}:?...}}, no token in the file)")
        if resolved is not None:
            check(env_of(services.get(s, {})).get(TOKEN) == DUMMY_TOKEN,
                  f"{name}: {s} gets {TOKEN} once resolved")
    gpus = []
    if gpu:
        mps = services.get("mps", {})
        mps_cmd = " ".join(mps.get("command", []) if isinstance(mps.get("command"), list) else [mps.get("command", "")])
        check("nvidia-cuda-mps-control -f" in mps_cmd, f"{name}: mps runs nvidia-cuda-mps-control in the foreground")
        check((mps.get("healthcheck", {}) or {}).get("test", [])[:3] == ["CMD", "strata-healthcheck", "mps"],
              f"{name}: mps has the MPS health check")
        pipe = env_of(mps).get("CUDA_MPS_PIPE_DIRECTORY")
        check(pipe, f"{name}: mps sets CUDA_MPS_PIPE_DIRECTORY ({pipe})")
        mps_volume = [m for m in mounts_of(mps) if m.get("type") == "volume" and pipe
                      and (pipe + "/").startswith(m.get("target", "").rstrip("/") + "/")]
        check(len(mps_volume) == 1, f"{name}: mps keeps its pipe directory on a volume")
        gpus = [d for dev in reservation(mps) for d in dev.get("device_ids", [])]
        check(gpus, f"{name}: mps reserves the cluster's GPUs ({gpus})")
        for s in ["router"] + workers + ["mps"]:
            v = services.get(s, {})
            res = reservation(v)
            check(len(res) == 1 and res[0].get("driver") == "nvidia" and "gpu" in res[0].get("capabilities", []),
                  f"{name}: {s} reserves NVIDIA GPUs")
            check([d for dev in res for d in dev.get("device_ids", [])] == gpus,
                  f"{name}: {s} reserves the same GPUs as the others ({gpus})")
            env = env_of(v)
            check(env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID", f"{name}: {s} numbers GPUs in PCI bus order")
            if s == "mps":
                continue
            check(env.get("CUDA_MPS_PIPE_DIRECTORY") == pipe, f"{name}: {s} uses the MPS daemon's pipe directory")
            check(any(m.get("source") == mps_volume[0].get("source") and m.get("target") == mps_volume[0].get("target")
                      for m in mounts_of(v)) if mps_volume else False,
                  f"{name}: {s} mounts the MPS volume where the daemon does")
            check(depends(v).get("mps") == "service_healthy", f"{name}: {s} starts once the MPS daemon answers")
        check(flag(router, "router-device") == "cuda:0", f"{name}: router on --router-device=cuda:0")
    else:
        for s in services:
            check(not reservation(services[s]), f"{name}: {s} reserves no GPU")
        check(flag(router, "router-device") in (None, "cpu"), f"{name}: router on the CPU")
    indexes, devices = [], []
    for w in workers:
        v = services[w]
        cmd = v.get("command", [])
        check(cmd[:1] == ["strata-worker"], f"{name}: {w} runs strata-worker")
        check(flag(cmd, "store-address") == "expert-store:50052" and flag(cmd, "router") == "router:50053",
              f"{name}: {w} reaches expert-store:50052 and the router's internal listener router:50053 by service name"
              f" ({flag(cmd, 'store-address')}, {flag(cmd, 'router')})")
        check(flag(cmd, "transport") in (None, "shm"), f"{name}: {w} uses the shm transport")
        check(flag(cmd, "max-batch-tokens") == flag(router, "max-batch-tokens"),
              f"{name}: {w} and the router agree on --max-batch-tokens")
        check(flag(cmd, "weights") == flag(router, "weights"), f"{name}: {w} and the router agree on --weights")
        indexes.append(flag(cmd, "index"))
        device = flag(cmd, "device")
        devices.append(device)
        if gpu:
            i = cuda_index(device)
            check(i is not None and i < len(gpus), f"{name}: {w} on a reserved GPU (--device={device})")
        else:
            check(device == "cpu", f"{name}: {w} runs on --device=cpu")
    check(sorted(indexes) == [str(i) for i in range(len(workers))],
          f"{name}: worker indexes are 0..{len(workers) - 1} ({indexes})")
    if gpu and len(workers) <= len(gpus):
        check(len(set(devices)) == len(devices), f"{name}: one GPU per worker ({devices})")
    return doc

gpu_doc = compose_checks("docker-compose", gpu=True)
cpu_doc = compose_checks("docker-compose.cpu", gpu=False)

GPU_FLAGS = ("--router-device=", "--weights=")
GPU_ENV = ("CUDA_DEVICE_ORDER", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
def cpu_view(doc):
    """The file without its GPU parts: the mps service and volume, GPU reservations, GPU
    environment and mounts, the GPU-only flags, cuda devices; image tags, build arguments and
    --threads values normalised (the files' defaults differ there on purpose)."""
    doc = yaml.safe_load(yaml.safe_dump(doc))
    services = doc.get("services", {})
    services.pop("mps", None)
    mps_volumes = set()
    for name, v in services.items():
        v.pop("deploy", None)
        v["image"] = "IMAGE"
        if name != "shm" and "cpus" in v:
            v["cpus"] = "N"  # the CPU quota follows --threads, whose defaults differ
        if "build" in v:
            v["build"].pop("args", None)
        d = v.get("depends_on")
        if isinstance(d, dict):
            d.pop("mps", None)
        env = v.get("environment")
        if isinstance(env, dict):
            for k in GPU_ENV:
                env.pop(k, None)
        if "volumes" in v:
            keep = []
            for m in v["volumes"]:
                if isinstance(m, dict) and m.get("type") == "volume" and str(m.get("target", "")).startswith("/run/strata-mps"):
                    mps_volumes.add(m.get("source"))
                    continue
                keep.append(m)
            v["volumes"] = keep
        cmd = [a for a in v.get("command", []) if not a.startswith(GPU_FLAGS)] if isinstance(v.get("command"), list) else v.get("command")
        if isinstance(cmd, list):
            cmd = [re.sub(r"^--device=cuda:\d+$", "--device=cpu", a) for a in cmd]
            cmd = [re.sub(r"^--threads=.*", "--threads=N", a) for a in cmd]
            # The step size defaults differ as strata up's do (4096 with a GPU router, 512 on a CPU).
            cmd = [re.sub(r"^--max-batch-tokens=.*", "--max-batch-tokens=N", a) for a in cmd]
            v["command"] = cmd
    volumes = doc.get("volumes") or {}
    for vol in mps_volumes:
        volumes.pop(vol, None)
    if not volumes:
        doc.pop("volumes", None)
    doc.pop("name", None)  # Compose v2 writes the project name, from the file's directory
    for key in [k for k in doc if str(k).startswith("x-")]:
        doc.pop(key)  # Compose v2 keeps the extension fields (the anchors' sources)
    return doc

a, b = cpu_view(gpu_doc), cpu_view(cpu_doc)
same = a == b
diff = [] if same else sorted(s for s in set(a["services"]) | set(b["services"])
                              if a["services"].get(s) != b["services"].get(s))
if not same and not diff:
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
check(same, "docker-compose.yml and docker-compose.cpu.yml differ only in the GPU parts"
      + ("" if same else f" (differing: {diff})"))

# --- Kubernetes.
REQUIRED = {
    "ConfigMap": ["metadata.name"],
    "Deployment": ["metadata.name", "spec.selector.matchLabels", "spec.template.metadata.labels",
                   "spec.template.spec.containers"],
    "Service": ["metadata.name", "spec.selector", "spec.ports"],
    "ResourceClaimTemplate": ["metadata.name", "spec.spec.devices.requests"],
    "Kustomization": ["resources"],
}
API = {"ConfigMap": "v1", "Deployment": "apps/v1", "Service": "v1",
       "ResourceClaimTemplate": "resource.k8s.io/v1",
       "Kustomization": "kustomize.config.k8s.io/v1beta1"}

def get(d, path):
    for key in path.split("."):
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d

def quantity(q):
    """A Kubernetes quantity ("500m", "2", "4Gi", "1G") as a number."""
    m = re.fullmatch(r"([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", str(q))
    if not m:
        return float("nan")
    scale = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
    return float(m.group(1)) * scale

def load_docs(path):
    try:
        loaded = [d for d in yaml.safe_load_all(open(path)) if d is not None]
        check(True, f"{path}: YAML parses ({len(loaded)} document(s))")
    except yaml.YAMLError as e:
        check(False, f"{path}: YAML: {e}")
        return []
    for d in loaded:
        kind = d.get("kind")
        check(kind in API and d.get("apiVersion") == API.get(kind),
              f"{path}: {kind} has apiVersion {d.get('apiVersion')}")
        for field in REQUIRED.get(kind, []):
            check(get(d, field) not in (None, [], {}), f"{path}: {kind} has {field}")
    return loaded

KUSTOMIZATIONS = {"deploy/k8s": False, "deploy/k8s/gpu": True}  # directory: GPU path
listed = set()
for root, _, files in os.walk("deploy/k8s"):
    for f in files:
        if f.endswith((".yaml", ".yml")) and f != "kustomization.yaml":
            listed.add(os.path.join(root, f))
used = set()

def k8s_checks(directory, gpu):
    tag = f"k8s {'GPU' if gpu else 'CPU'} ({directory})"
    kpath = os.path.join(directory, "kustomization.yaml")
    check(os.path.exists(kpath), f"{tag}: {kpath} exists")
    if not os.path.exists(kpath):
        return
    kust = load_docs(kpath)
    docs = []
    for k in kust:
        for r in k.get("resources", []):
            path = os.path.normpath(os.path.join(directory, r))
            check(os.path.isfile(path), f"{tag}: resource {r} exists")
            if os.path.isfile(path):
                used.add(path)
                docs += load_docs(path)
    config = {}
    for d in docs:
        if d.get("kind") == "ConfigMap":
            config.update(d.get("data", {}) or {})
    deployments = [d for d in docs if d.get("kind") == "Deployment"]
    services = [d for d in docs if d.get("kind") == "Service"]
    claims = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ResourceClaimTemplate"}
    check(len(deployments) == 1, f"{tag}: one Deployment")
    for dep in deployments:
        spec = dep["spec"]["template"]["spec"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        check(all(labels.get(k) == v for k, v in dep["spec"]["selector"]["matchLabels"].items()),
              f"{tag}: Deployment selector matches its Pod labels")
        check(dep["spec"].get("replicas", 1) == 1 and get(dep, "spec.strategy.type") == "Recreate",
              f"{tag}: one replica, Recreate")
        check(spec.get("shareProcessNamespace") is True, f"{tag}: shareProcessNamespace: true")
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        dshm = [n for n, v in vols.items() if get(v, "emptyDir.medium") == "Memory" and n == "dshm"]
        check(len(dshm) == 1, f"{tag}: a memory-backed emptyDir dshm for /dev/shm")
        check(get(spec, "securityContext.runAsUser") is not None, f"{tag}: one uid for every container")
        containers = {c["name"]: c for c in spec["containers"]}
        inits = {c["name"]: c for c in spec.get("initContainers", []) or []}
        everything = {**containers, **inits}
        for name in ("expert-store", "router"):
            check(name in containers, f"{tag}: container {name}")
        workers = sorted((n for n in containers if re.fullmatch(r"worker-\d+", n)), key=lambda w: int(w[7:]))
        check(workers, f"{tag}: worker containers ({', '.join(workers)})")
        check(len({c.get("image") for c in everything.values()}) == 1, f"{tag}: one image for every container")
        for n, c in everything.items():
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
            check(mounts.get("/dev/shm", {}).get("name") in dshm, f"{tag}: {n} mounts the memory emptyDir at /dev/shm")
            model_dir = flag(c.get("command", []), "model")
            model_mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"].startswith("/models/")]
            check(len(model_mounts) == 1 and model_mounts[0].get("readOnly") is True
                  and model_dir in (None, model_mounts[0]["mountPath"]),
                  f"{tag}: {n} mounts the model read-only under /models/, where its --model={model_dir} points")
            check(model_mounts and model_mounts[0].get("name") in vols, f"{tag}: {n}'s model volume exists")
            for a in c.get("command", []) + c.get("args", []):
                for var in re.findall(r"\$\((\w+)\)", a):
                    known = var in config or any(e.get("name") == var for e in c.get("env", []))
                    check(known, f"{tag}: {n}: $({var}) is defined")
            limits = {**(get(c, "resources.limits") or {}), **(get(c, "resources.requests") or {})}
            check("nvidia.com/gpu" not in limits,
                  f"{tag}: {n} asks for no nvidia.com/gpu (the device plugin would give each container GPUs the others cannot see)")
            requests, hard = get(c, "resources.requests") or {}, get(c, "resources.limits") or {}
            check(all(requests.get(r) and hard.get(r) for r in ("cpu", "memory")),
                  f"{tag}: {n} has cpu and memory requests and limits ({requests}, {hard})")
            for r in ("cpu", "memory"):
                if requests.get(r) and hard.get(r):
                    check(quantity(hard[r]) >= quantity(requests[r]),
                          f"{tag}: {n}'s {r} limit {hard[r]} is not below its request {requests[r]}")
        store, router = containers.get("expert-store", {}), containers.get("router", {})
        scmd, rcmd = store.get("command", []), router.get("command", [])
        check(flag(scmd, "listen") == "0.0.0.0:50052", f"{tag}: expert-store listens on 50052")
        check(flag(rcmd, "listen") == "0.0.0.0:50051", f"{tag}: router listens on 50051 (clients)")
        check(flag(rcmd, "internal-listen") == "127.0.0.1:50053",
              f"{tag}: router's internal listener (Coordinator, Admin) on the Pod's loopback,"
              f" --internal-listen=127.0.0.1:50053 ({flag(rcmd, 'internal-listen')})")
        check(flag(rcmd, "workers") == str(len(workers)),
              f"{tag}: router --workers={flag(rcmd, 'workers')} matches {len(workers)} worker containers")
        check(get(router, "readinessProbe.grpc.port") == 50051, f"{tag}: router readiness is the gRPC health on 50051")
        check(get(router, "livenessProbe.tcpSocket.port") == 50051,
              f"{tag}: router liveness is a TCP check (gRPC health is NOT_SERVING while a worker restarts)")
        check(get(store, "livenessProbe.grpc.port") == 50052 or get(store, "startupProbe.grpc.port") == 50052,
              f"{tag}: expert-store has a gRPC probe on 50052")
        rports = {p.get("name"): p["containerPort"] for p in router.get("ports", [])}
        http_port = flag(rcmd, "http-port")
        check(http_port is not None and http_port.isdigit() and rports.get("http") == int(http_port),
              f"{tag}: router serves HTTP (--http-port={http_port}) on its containerPort named http ({rports.get('http')})")
        # Prometheus: annotation-based discovery on the Pod (and the Service below).
        def scrape_annotations(obj, what):
            a = get(obj, "metadata.annotations") or {}
            check(a.get("prometheus.io/scrape") == "true" and a.get("prometheus.io/port") == http_port
                  and a.get("prometheus.io/path") == "/metrics",
                  f"{tag}: {what} has prometheus.io/scrape, port {http_port} and path /metrics annotations ({a})")
        scrape_annotations(dep["spec"]["template"], "the Pod template")
        for svc in services:
            scrape_annotations(svc, f"Service {svc['metadata']['name']}")
            sports = {p.get("name"): p for p in svc["spec"]["ports"]}
            check("http" in sports and sports["http"].get("targetPort") in ("http", rports.get("http")),
                  f"{tag}: Service {svc['metadata']['name']} has a port named http on the router's HTTP port (for a ServiceMonitor)")
        check(50053 not in rports.values(), f"{tag}: the internal port 50053 is no containerPort of the router")
        # The cluster token: one Secret, by reference, in every strata process's container.
        refs = {}
        for n in ["expert-store", "router"] + workers:
            entries = [e for e in containers.get(n, {}).get("env", []) or [] if e.get("name") == "STRATA_CLUSTER_TOKEN"]
            ref = get(entries[0], "valueFrom.secretKeyRef") if len(entries) == 1 else None
            check(ref and ref.get("name") and ref.get("key") and "value" not in entries[0],
                  f"{tag}: {n} gets STRATA_CLUSTER_TOKEN from a Secret (secretKeyRef, no literal value)")
            if ref:
                refs[n] = (ref.get("name"), ref.get("key"))
        check(len(set(refs.values())) == 1, f"{tag}: every container reads the same token Secret ({sorted(set(refs.values()))})")
        literal = [n for n, c in everything.items() for e in c.get("env", []) or []
                   if e.get("name") == "STRATA_CLUSTER_TOKEN" and "value" in e]
        check(not literal, f"{tag}: no container has a token written in the manifest ({literal})")
        indexes, devices = [], []
        for w in workers:
            cmd = containers[w].get("command", [])
            indexes.append(flag(cmd, "index"))
            devices.append(flag(cmd, "device"))
            check(flag(cmd, "store-address") == "127.0.0.1:50052" and flag(cmd, "router") == "127.0.0.1:50053",
                  f"{tag}: {w} reaches the expert store and the router's internal listener on localhost"
                  f" ({flag(cmd, 'store-address')}, {flag(cmd, 'router')})")
            check(flag(cmd, "max-batch-tokens") == flag(rcmd, "max-batch-tokens"),
                  f"{tag}: {w} and the router agree on --max-batch-tokens")
            check(flag(cmd, "weights") == flag(rcmd, "weights"), f"{tag}: {w} and the router agree on --weights")
        check(sorted(indexes) == [str(i) for i in range(len(workers))], f"{tag}: worker indexes 0..{len(workers) - 1}")
        pod_claims = {c["name"]: c.get("resourceClaimTemplateName") for c in spec.get("resourceClaims", []) or []}
        if not gpu:
            check(not claims and not pod_claims, f"{tag}: no GPU claims")
            check(all(d == "cpu" for d in devices), f"{tag}: workers on --device=cpu ({devices})")
            check(flag(rcmd, "router-device") in (None, "cpu"), f"{tag}: router on the CPU")
            check(not inits, f"{tag}: no init containers")
        else:
            check(len(pod_claims) == 1, f"{tag}: the Pod has one resource claim ({list(pod_claims)})")
            claim_name, template = next(iter(pod_claims.items())) if pod_claims else (None, None)
            check(template in claims, f"{tag}: its ResourceClaimTemplate {template} is in the manifests")
            requests = get(claims.get(template, {}), "spec.spec.devices.requests") or []
            count = sum(int(get(r, "exactly.count") or 0) for r in requests
                        if get(r, "exactly.deviceClassName") == "gpu.nvidia.com")
            check(count >= 1, f"{tag}: the claim asks for {count} NVIDIA GPU(s) (device class gpu.nvidia.com)")
            check(flag(rcmd, "router-device") == "cuda:0", f"{tag}: router on --router-device=cuda:0")
            mps = inits.get("mps", {})
            check(mps, f"{tag}: an mps init container")
            check(mps.get("restartPolicy") == "Always", f"{tag}: mps is a native sidecar (restartPolicy: Always)")
            check(get(mps, "startupProbe.exec.command") == ["strata-healthcheck", "mps"],
                  f"{tag}: mps's startup probe holds the others back until the daemon answers")
            check("nvidia-cuda-mps-control -f" in " ".join(mps.get("command", [])),
                  f"{tag}: mps runs nvidia-cuda-mps-control in the foreground")
            pipe = config.get("CUDA_MPS_PIPE_DIRECTORY")
            check(pipe, f"{tag}: the ConfigMap sets CUDA_MPS_PIPE_DIRECTORY")
            check(config.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID", f"{tag}: GPUs numbered in PCI bus order")
            def mps_mount(c):
                return [(m["name"], m["mountPath"]) for m in c.get("volumeMounts", [])
                        if pipe and (pipe + "/").startswith(m["mountPath"].rstrip("/") + "/")]
            for n in ["mps", "router"] + workers:
                c = everything.get(n, {})
                check(claim_name in [x.get("name") for x in get(c, "resources.claims") or []],
                      f"{tag}: {n} uses the GPU claim {claim_name}")
                check(any(e.get("configMapRef", {}).get("name") for e in c.get("envFrom", [])),
                      f"{tag}: {n} takes the ConfigMap's environment (MPS pipe directory, device order)")
                check(mps_mount(c) and mps_mount(c) == mps_mount(mps),
                      f"{tag}: {n} mounts the MPS pipe directory's volume where the daemon does")
            check(all(cuda_index(d) is not None and cuda_index(d) < count for d in devices),
                  f"{tag}: workers on claimed GPUs ({devices}, {count} claimed)")
            if len(workers) <= count:
                check(len(set(devices)) == len(devices), f"{tag}: one GPU per worker ({devices})")
            check("expert-store" not in [n for n in containers if get(containers[n], "resources.claims")],
                  f"{tag}: the expert store holds no GPU")
        for svc in services:
            check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
                  f"{tag}: Service {svc['metadata']['name']} selects the Pod")
            for p in svc["spec"]["ports"]:
                t = p.get("targetPort")
                check(t in rports or t in rports.values(), f"{tag}: Service port {p.get('name')} targets the router ({t})")
                check(rports.get(t, t) in (50051, rports.get("http")) and p.get("port") != 50053,
                      f"{tag}: Service port {p.get('name')} is a client port (50051 or HTTP), not the internal 50053")

for directory, gpu in KUSTOMIZATIONS.items():
    k8s_checks(directory, gpu)
check(listed <= used, f"k8s: every manifest belongs to a kustomization ({sorted(listed - used)})")

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

for dir in deploy/k8s deploy/k8s/gpu; do
  if command -v kubectl >/dev/null 2>&1; then
    if kubectl kustomize "$dir" >"$tmp/kustomized.yaml" 2>"$tmp/kustomize.err"; then
      pass "kubectl kustomize $dir"
    else
      fail "kubectl kustomize $dir: $(cat "$tmp/kustomize.err")"
      continue
    fi
    # Offline schema validation where the tool is installed (pip install kubernetes-validate).
    if command -v kubernetes-validate >/dev/null 2>&1; then
      if out=$(kubernetes-validate --strict --quiet -k 1.34.0 "$tmp/kustomized.yaml" 2>&1) && [ -z "$out" ]; then
        pass "kubernetes-validate --strict (1.34) $dir"
      else
        fail "kubernetes-validate --strict (1.34) $dir: $out"
      fi
    fi
  fi
done

# ---- Dockerfile ---------------------------------------------------------------------------
# The build arguments docs/deploy.md and the compose files rely on, and both variants' stages.
for arg in VARIANT CUDA_VERSION CUDA_BUILD_IMAGE CUDA_RUNTIME_IMAGE CUDA_ARCHITECTURES \
           DEBIAN_BUILD_IMAGE DEBIAN_RUNTIME_IMAGE JOBS STRATA_UID; do
  if grep -qx "$arg" "$tmp/dockerfile-args.txt"; then pass "Dockerfile declares ARG $arg"
  else fail "Dockerfile does not declare ARG $arg"; fi
done
for stage in build-base-cpu build-base-cuda runtime-base-cpu runtime-base-cuda build runtime; do
  if grep -qE "^FROM .* AS $stage\$" deploy/Dockerfile; then pass "Dockerfile stage $stage"
  else fail "Dockerfile has no stage $stage"; fi
done
if grep -qE '^ARG CUDA_BUILD_IMAGE=nvidia/cuda:\$\{CUDA_VERSION\}-devel-' deploy/Dockerfile &&
   grep -qE '^ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:\$\{CUDA_VERSION\}-runtime-' deploy/Dockerfile; then
  pass "the CUDA build and runtime images share CUDA_VERSION"
else
  fail "the CUDA build and runtime images do not both follow CUDA_VERSION"
fi
if grep -q -- '-DCMAKE_CUDA_ARCHITECTURES=' deploy/Dockerfile && grep -q -- '-DSTRATA_CUDA=ON' deploy/Dockerfile; then
  pass "the CUDA variant passes -DSTRATA_CUDA=ON and -DCMAKE_CUDA_ARCHITECTURES"
else
  fail "the CUDA variant does not pass -DSTRATA_CUDA=ON and -DCMAKE_CUDA_ARCHITECTURES"
fi
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
for needed in scripts/build.sh deploy/runtime-packages.sh CMakeLists.txt cmake proto common services tools; do
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
for script in deploy/healthcheck.sh deploy/runtime-packages.sh scripts/check_deploy.sh scripts/compose_run.sh; do
  if [ -x "$script" ]; then pass "$script is executable"
  else fail "$script is not executable"; fi
done

# ---- strata-healthcheck grpc against a stand-in server -------------------------------------------
# The compose files' health checks speak grpc.health.v1 in bash (HTTP/2 frames by hand): check
# it against Python's gRPC (the same C core as the router's) answering SERVING for "",
# NOT_SERVING for strata.v1.Generation, an empty answer (UNKNOWN) for "zero" and NOT_FOUND for
# any other name. compose_run.sh checks it against the real router.
if /usr/bin/python3 -c 'import grpc' 2>/dev/null; then
  cat >"$tmp/health_server.py" <<'PYEOF'
import sys, time
from concurrent import futures
import grpc
answers = {b"": b"\x08\x01", b"strata.v1.Generation": b"\x08\x02", b"zero": b""}
def check(request, context):
    name = request[2:] if request else b""
    if name not in answers:
        context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
    return answers[name]
server = grpc.server(futures.ThreadPoolExecutor(2))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
    "Check": grpc.unary_unary_rpc_method_handler(check)}),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
time.sleep(120)
PYEOF
  /usr/bin/python3 "$tmp/health_server.py" >"$tmp/health_server.port" 2>"$tmp/health_server.err" &
  health_server=$!
  for _ in $(seq 50); do [ -s "$tmp/health_server.port" ] && break; sleep 0.1; done
  port=$(cat "$tmp/health_server.port")
  if [ -n "$port" ]; then
    expect_health() { # expect_health EXIT_STATUS SERVICE WHAT
      local out status=0
      out=$(deploy/healthcheck.sh grpc "127.0.0.1:$port" ${2:+"$2"} 2>&1) || status=$?
      if [ "$status" -eq "$1" ]; then pass "strata-healthcheck grpc: $3 (exit $status${out:+: $out})"
      else fail "strata-healthcheck grpc: $3: exit $status, expected $1 ($out)"; fi
    }
    expect_health 0 "" "SERVING passes"
    expect_health 1 strata.v1.Generation "NOT_SERVING fails"
    expect_health 1 zero "UNKNOWN (an empty answer) fails"
    expect_health 1 no.such.Service "an unknown service (NOT_FOUND, no answer) fails"
  else
    fail "the stand-in gRPC health server did not start: $(cat "$tmp/health_server.err")"
  fi
  kill "$health_server" 2>/dev/null
  wait "$health_server" 2>/dev/null
  # Nothing listens there any more.
  [ -z "$port" ] || expect_health 1 "" "a closed port fails"
else
  echo "skip: no python3-grpcio, so strata-healthcheck grpc was not run against a server"
fi

# ---- runtime packages (needs a build) ---------------------------------------------------------
bins=(build/bin/strata build/bin/strata-expert-store build/bin/strata-worker build/bin/strata-router)
if [ -x build/bin/strata-router ] && [ -x build/bin/strata-worker ] && [ -x build/bin/strata-expert-store ] && [ -x build/bin/strata ]; then
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
