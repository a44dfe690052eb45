"""cluster.yaml (AWS) and examples/cluster-onprem.yaml (Ray's `local` provider) pass the cluster-config checks
that `ray up` runs before it contacts any machine, and keep the shape stark-ray relies on.

`ray up` loads the YAML, then ``prepare_config`` (merges the provider's defaults.yaml shipped inside Ray, the
common setup commands into the head's and the workers', per-type worker bounds) and ``validate_config`` (Ray's
JSON schema plus its cross-field rules). Its later steps (looking instance types up in EC2, creating the IAM
role, key pair and security group) need AWS and are not run here. Everything below is offline: the ``offline``
fixture fails a test that opens a socket or imports the AWS SDK.

Every check is shown to fail on a broken copy of the files (the ``test_*_rejected`` tests), so a passing run
means the real files pass them.
"""

from __future__ import annotations

import copy
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

try:
    from ray.autoscaler._private.util import prepare_config, validate_config
except ImportError as e:  # a private module: a future Ray may move it
    pytest.skip(f"Ray's cluster-config validation (ray.autoscaler._private.util.prepare_config / "
                f"validate_config) is not importable in this Ray: {e}", allow_module_level=True)
jsonschema = pytest.importorskip("jsonschema", reason="Ray's validate_config needs jsonschema (a dependency of ray)")

REPO = Path(__file__).resolve().parents[1]
AWS = REPO / "cluster.yaml"
ONPREM = REPO / "examples" / "cluster-onprem.yaml"

# vCPUs and GPUs of the EC2 instance types cluster.yaml uses or suggests. A node type's declared resources must
# equal its instance's: Ray advertises exactly the declared numbers on the node, and the autoscaler plans with them.
INSTANCE_SPECS: dict[str, tuple[int, int]] = {
    "m7i.2xlarge": (8, 0),
    "g6e.xlarge": (4, 1),
    "g6e.4xlarge": (16, 1),
    "p5.4xlarge": (16, 1),
    "p5.48xlarge": (192, 8),
    "p5en.48xlarge": (192, 8),
}

Config = dict[str, Any]


# -- offline -------------------------------------------------------------------------------------------------------
@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("cluster-config validation tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def offline(no_network: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No network, and no AWS SDK: importing boto3 or botocore raises ImportError, so nothing can reach for
    credentials or EC2 (only `ray up`'s bootstrap does that, and it is not called)."""
    for module in ("boto3", "botocore"):
        monkeypatch.setitem(sys.modules, module, None)


# -- helpers -------------------------------------------------------------------------------------------------------
def load(path: Path) -> Config:
    return yaml.safe_load(path.read_text())  # as `ray up` reads it


def ray_checked(raw: Config) -> Config:
    """What `ray up` makes of the file before it launches anything; raises as `ray up` would."""
    config = prepare_config(copy.deepcopy(raw))
    validate_config(config)
    return config


def worker_types(config: Config) -> dict[str, Config]:
    return {name: t for name, t in config["available_node_types"].items() if name != config["head_node_type"]}


def check_aws_shape(config: Config) -> None:
    """A CPU head; GPU worker types the autoscaler can add; resources that match the instance types."""
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0, "the head node type offers GPUs: Evaluators belong on workers"
    assert head["max_workers"] == 0, "the head node type must not be launched as a worker too"
    gpu_types = {name: t for name, t in worker_types(config).items() if t["resources"].get("GPU", 0) > 0}
    assert gpu_types, "no worker node type offers a GPU"
    for name, t in gpu_types.items():
        assert t["max_workers"] > t["min_workers"], f"{name}: max_workers must exceed min_workers to autoscale"
    assert config["max_workers"] > sum(t["min_workers"] for t in worker_types(config).values()), (
        "the global max_workers leaves no room above the min_workers to scale up")
    for name, t in types.items():
        instance = t["node_config"]["InstanceType"]
        assert instance in INSTANCE_SPECS, f"{name}: add {instance}'s vCPUs and GPUs to INSTANCE_SPECS"
        cpus, gpus = INSTANCE_SPECS[instance]
        declared = (t["resources"].get("CPU"), t["resources"].get("GPU", 0))
        assert declared == (cpus, gpus), f"{name}: resources {declared} (CPU, GPU) but {instance} has {(cpus, gpus)}"


def check_installs_stark_ray(config: Config) -> None:
    """Head and workers both install stark-ray (and the workers torch), from the working tree that
    file_mounts copies to the nodes (`ray up` runs from the repository root, so "." is the repository)."""
    assert re.search(r'^name\s*=\s*"stark-ray"', (REPO / "pyproject.toml").read_text(), re.M)
    synced = {remote for remote, local in config["file_mounts"].items()
              if (REPO / Path(local).expanduser()).resolve() == REPO}
    for role in ("head_setup_commands", "worker_setup_commands"):  # after prepare_config: setup_commands + own
        installs = [c for c in config[role] if "pip install" in c and "stark-ray" in c]
        assert installs, f"{role} never install stark-ray"
        for command in installs:
            paths = [w for w in command.split() if w.startswith(("~/", "/"))]
            assert all(p in synced for p in paths), (
                f"{role}: {command!r} installs from {paths}, but file_mounts copies the repository to {synced}")
    assert any("pip install" in c and "torch" in c for c in config["worker_setup_commands"]), (
        "worker_setup_commands never install torch")


def check_onprem_shape(config: Config) -> None:
    provider = config["provider"]
    assert provider["type"] == "local"
    assert provider["head_ip"] and provider["worker_ips"], "the local provider needs head_ip and worker_ips"
    node = config["available_node_types"][config["head_node_type"]]  # the one type prepare_config made
    assert node["min_workers"] == node["max_workers"] == len(provider["worker_ips"])
    assert any("ray start --head" in c and "--num-gpus=0" in c for c in config["head_start_ray_commands"]), (
        "the head must start with --num-gpus=0 so that Evaluators go to the GPU machines")


# -- the real files ------------------------------------------------------------------------------------------------
def test_aws_config_passes_ray_checks(offline: None) -> None:
    config = ray_checked(load(AWS))
    assert config["provider"]["type"] == "aws" and config["provider"]["region"]
    check_aws_shape(config)
    check_installs_stark_ray(config)
    assert any("boto3" in c for c in config["head_setup_commands"]), (
        "the head's autoscaler needs boto3 to launch workers")


def test_onprem_config_passes_ray_checks(offline: None) -> None:
    config = ray_checked(load(ONPREM))
    check_onprem_shape(config)
    check_installs_stark_ray(config)


def test_onprem_uses_the_same_setup_as_aws() -> None:
    aws, onprem = load(AWS), load(ONPREM)
    for key in ("setup_commands", "worker_setup_commands", "file_mounts", "rsync_exclude", "rsync_filter"):
        assert onprem[key] == aws[key], f"{key} differ between cluster.yaml and examples/cluster-onprem.yaml"


def test_aws_node_configs_are_valid_ec2_requests(no_network: None) -> None:
    """Each node_config, as Ray hands it to EC2's RunInstances, against the request schema botocore ships
    (offline: a service model is a JSON file in the package); the instance types are ones EC2 knows."""
    session = pytest.importorskip("botocore.session", reason="botocore is not installed (only `ray up` on AWS "
                                                             "needs it); the Ray checks above still ran")
    from botocore.validate import ParamValidator

    run_instances = session.get_session().get_service_model("ec2").operation_model("RunInstances")
    known = set(run_instances.input_shape.members["InstanceType"].enum)
    for name, node_type in load(AWS)["available_node_types"].items():
        request = {**node_type["node_config"], "MinCount": 1, "MaxCount": 1}
        report = ParamValidator().validate(request, run_instances.input_shape)
        assert not report.has_errors(), f"{name}: {report.generate_report()}"
        assert node_type["node_config"]["InstanceType"] in known


# -- broken copies are rejected ------------------------------------------------------------------------------------
Mutation = Callable[[Config], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(raw: Config) -> None:
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node[key]
        node[last] = value
    return mutate


def _delete(path: str) -> Mutation:
    def mutate(raw: Config) -> None:
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node[key]
        del node[last]
    return mutate


def _no_gpu_workers(raw: Config) -> None:
    for name in worker_types(raw):
        raw["available_node_types"][name]["resources"].pop("GPU", None)


def _drop_commands(key: str, word: str) -> Mutation:
    def mutate(raw: Config) -> None:
        raw[key] = [c for c in raw[key] if word not in c]
    return mutate


RAY_REJECTS_AWS: dict[str, tuple[Mutation, type[Exception]]] = {
    "misspelt top-level field": (_set("max_worker", 4), jsonschema.ValidationError),
    "node type without resources": (_delete("available_node_types.gpu_l40s_1x.resources"),
                                    jsonschema.ValidationError),
    "resource count not an integer": (_set("available_node_types.gpu_h200_8x.resources.GPU", "eight"),
                                      jsonschema.ValidationError),
    "unknown field in a node type": (_set("available_node_types.gpu_l40s_1x.instance_type", "g6e.4xlarge"),
                                     jsonschema.ValidationError),
    "head type that is not a node type": (_set("head_node_type", "ray.head.default"), ValueError),
    "min_workers above the global max_workers": (_set("available_node_types.gpu_l40s_1x.min_workers", 11),
                                                 ValueError),
}

WE_REJECT_AWS: dict[str, tuple[Mutation, str]] = {
    "head with a GPU": (_set("available_node_types.head.resources.GPU", 1), "head node type offers GPUs"),
    "no GPU workers": (_no_gpu_workers, "no worker node type offers a GPU"),
    "worker type that cannot grow": (_set("available_node_types.gpu_h200_8x.min_workers", 2), "to autoscale"),
    "resources unlike the instance": (_set("available_node_types.gpu_h200_8x.resources.GPU", 4), "p5en.48xlarge has"),
    "stark-ray not installed": (_drop_commands("setup_commands", "stark-ray"), "never install stark-ray"),
    "install from a path that is not synced": (_set("file_mounts", {"~/elsewhere": "."}), "installs from"),
    "torch not installed": (_drop_commands("setup_commands", "torch"), "never install torch"),
}


@pytest.mark.parametrize("case", RAY_REJECTS_AWS)
def test_broken_aws_config_rejected_by_ray(case: str, offline: None) -> None:
    mutate, error = RAY_REJECTS_AWS[case]
    raw = load(AWS)
    mutate(raw)
    with pytest.raises(error):
        ray_checked(raw)


@pytest.mark.parametrize("case", WE_REJECT_AWS)
def test_broken_aws_config_rejected_by_our_checks(case: str, offline: None) -> None:
    mutate, message = WE_REJECT_AWS[case]
    raw = load(AWS)
    mutate(raw)
    config = ray_checked(raw)  # still a valid Ray config: only our checks can tell
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_aws_shape(config)
        check_installs_stark_ray(config)


RAY_REJECTS_ONPREM: dict[str, tuple[Mutation, type[Exception]]] = {
    "misspelt top-level field": (_set("setup_command", []), jsonschema.ValidationError),
    "no worker_ips": (_delete("provider.worker_ips"), click.ClickException),
    "node types (unsupported by the local provider)": (_set("available_node_types", {"gpu": {}}),
                                                       click.ClickException),
}


@pytest.mark.parametrize("case", RAY_REJECTS_ONPREM)
def test_broken_onprem_config_rejected_by_ray(case: str, offline: None) -> None:
    mutate, error = RAY_REJECTS_ONPREM[case]
    raw = load(ONPREM)
    mutate(raw)
    with pytest.raises(error):
        ray_checked(raw)


def test_broken_onprem_config_rejected_by_our_checks(offline: None) -> None:
    raw = load(ONPREM)
    raw["head_start_ray_commands"] = [c.replace(" --num-gpus=0", "") for c in raw["head_start_ray_commands"]]
    with pytest.raises(AssertionError, match="--num-gpus=0"):
        check_onprem_shape(ray_checked(raw))


def test_unparsable_yaml_rejected(tmp_path: Path) -> None:
    broken = tmp_path / "cluster.yaml"
    broken.write_text(AWS.read_text().replace("head_node_type: head", "head_node_type: [head"))
    with pytest.raises(yaml.YAMLError):
        load(broken)
