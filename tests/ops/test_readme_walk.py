"""The README's "On AWS" steps, read from README.md and run in order against a stand-in account.

Each command of the block runs as a user would type it: the `nvrx-eks` commands are the real ones (in
process), against moto (STS, ECR, EKS, CloudFormation, EC2) with the calls moto lacks answered from
the account's facts below (the Capacity Block, quotas) and from a dated record of what AWS and the
chart repositories publish (tests/ops/published.yaml: the Kubernetes versions, the add-on versions EKS
offers and their configuration schemas, each chart's published versions), never from the pins, so a
pin nothing publishes fails the walk; `npx cdk
deploy` synthesizes the real app (its deploy gate included) and "deploys" the template: the resources
the later steps use are created in moto and the stack's outputs resolved from the template; `aws eks
update-nodegroup-config` scales the stand-in node group; the container engine behind `image build` /
`image push` is a stand-in that builds nothing and pushes a manifest per tag into moto's ECR; and a
stand-in Kubernetes API serves `job submit` and `job status`: it answers only the user's network if the
deployed cluster security group admits it on 443 (the endpoint is private), admits only an EKS token
signed by a principal that has an access entry in the deployed template, and runs a pod only if its
image is in the repository by digest and a node is there for it. The environment names no Region, as
on a workstation whose default is another: a command that needs one gets it from the README.

The user's own facts enter where the README names them: the upper-case placeholders (ACCOUNT, REGION)
and the fields a `# edit FILE: field, ...` line tells them to set. Anything else the README leaves
from its examples (a reservation id, a tag or digest, a job name) is used as written, and the walk
fails at the first step that cannot work with it, naming the step.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
import urllib3
import yaml
from botocore.awsrequest import AWSResponse
from kubernetes.client.rest import RESTClientObject, RESTResponse
from moto import mock_aws
from typer.testing import CliRunner

from nvrx_eks.infra import cluster_pins
from nvrx_eks.infra.ops.aws import AwsSession
from nvrx_eks.kitcore import pins

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"  # moto's account
REGION = "us-east-2"
# The stand-in account's Capacity Block: not the example config's id, nor its zone, nor one of the
# example's availability zones.
BLOCK_ID = "cr-0f1e2d3c4b5a69788"
BLOCK_ZONE = "us-east-2c"
BLOCK_SIZE = 2
# The user works from their VPN, whose client range reaches the VPC (not the VPC itself).
USER_NETWORK = "10.200.0.0/16"
USER_ADDRESS = "10.200.7.9"
# What the user substitutes for the README's placeholders.
PLACEHOLDERS = {"ACCOUNT": ACCOUNT, "REGION": REGION}
# What the user writes into the fields a `# edit FILE: ...` line names (the last dotted part decides).
USER_FIELDS: dict[str, object] = {
    "reservation_id": BLOCK_ID,
    "gpu_availability_zone": BLOCK_ZONE,
    "availability_zones": [BLOCK_ZONE, "us-east-2a"],
    "cidrs": [USER_NETWORK],
}
PUBLISHED = yaml.safe_load((Path(__file__).with_name("published.yaml")).read_text())
"""What AWS and the chart repositories publish, recorded on PUBLISHED["recorded"]."""
API_HOST = "https://api.nvrx-eks.stand-in"


@dataclass(frozen=True)
class Command:
    step: str
    argv: list[str]

    def __str__(self) -> str:
        return f"step {self.step}: `{shlex.join(self.argv)}`"


@dataclass(frozen=True)
class Edit:
    step: str
    path: str
    fields: list[str]


def readme_steps(text: str) -> list[Command | Edit]:
    """The commands of the first ```bash block under "## On AWS", in order, with the step number
    of the `# N.` comment above each; `# edit FILE: a.b, c` lines become edits."""
    section = text.split("\n## On AWS", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    steps: list[Command | Edit] = []
    step = "0"
    lines = block.replace("\\\n", " ").splitlines()
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            number = re.match(r"#\s*(\d+)\.", stripped)
            step = number.group(1) if number else step
            edit = re.match(r"#\s*edit (\S+): (.+)", stripped)
            if edit:
                steps.append(Edit(step, edit.group(1), [f.strip() for f in edit.group(2).split(",")]))
            continue
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in [*words, "&&"]:
            if word in {"&&", ";"}:
                if current:
                    steps.append(Command(step, current))
                current = []
            else:
                current.append(word)
    return steps


# -- the account's facts moto does not model ------------------------------------------------------


def _addon_versions(params: dict) -> dict:
    kubernetes, name = params["kubernetesVersion"], params["addonName"]
    offered = PUBLISHED["eks_addons"].get(name, {}).get(kubernetes, {}).get("versions", [])
    versions = [
        {
            "addonVersion": version,
            "architecture": ["amd64", "arm64"],
            "compatibilities": [{"clusterVersion": kubernetes, "defaultVersion": i == 0}],
        }
        for i, version in enumerate(offered)
    ]
    return {
        "addons": [{"addonName": name, "type": "networking", "addonVersions": versions}] if versions else []
    }


def _addon_configuration(params: dict) -> dict:
    schema = PUBLISHED["addon_configuration"].get(params["addonName"])
    if schema is None:
        raise _ClientError(
            "InvalidParameterException", f"no configuration recorded for {params['addonName']}"
        )
    return {
        "addonName": params["addonName"],
        "addonVersion": params["addonVersion"],
        "configurationSchema": json.dumps(schema),
    }


def _cluster_versions(params: dict) -> dict:
    found = []
    for version in params["clusterVersions"]:
        recorded = PUBLISHED["kubernetes"].get(version)
        if recorded is not None:
            found.append(
                {
                    "clusterVersion": version,
                    "versionStatus": recorded["status"],
                    "endOfStandardSupportDate": recorded["standard_support_ends"],
                }
            )
    return {"clusterVersions": found}


def _chart_repository(url: str, headers: Any) -> Any:
    """The Helm repositories as recorded: an HTTP repository's index.yaml, an OCI registry's tags."""
    from nvrx_eks.infra.ops.charts import Answer  # noqa: PLC0415

    for repository, charts in PUBLISHED["helm"].items():
        if url == f"{repository.rstrip('/')}/index.yaml":
            entries = {
                chart: [{"name": chart, "version": v} for v in versions] for chart, versions in charts.items()
            }
            return Answer(200, yaml.safe_dump({"apiVersion": "v1", "entries": entries}).encode())
        host, _, path = repository.removeprefix("oci://").partition("/")
        for versions in charts.values():
            for version in versions:
                if url == f"https://{host}/v2/{path}/manifests/{version}":
                    return Answer(200, b"{}")
        if url.startswith(f"https://{host}/v2/{path}/manifests/"):
            return Answer(404)
    return Answer(404)


def _reservations(params: dict) -> dict:
    if params.get("CapacityReservationIds") != [BLOCK_ID]:
        raise _ClientError("InvalidCapacityReservationId.NotFound", f"{params} not found")
    return {
        "CapacityReservations": [
            {
                "CapacityReservationId": BLOCK_ID,
                "InstanceType": "p5.48xlarge",
                "AvailabilityZone": BLOCK_ZONE,
                "TotalInstanceCount": BLOCK_SIZE,
                "AvailableInstanceCount": BLOCK_SIZE,
                "State": "active",
                "ReservationType": "capacity-block",
                "Tags": [],
            }
        ]
    }


def _quota(params: dict) -> dict:
    return {"Quota": {"ServiceCode": "ec2", "QuotaCode": params["QuotaCode"], "Value": 4096.0}}


class _ClientError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


FACTS = {
    "DescribeClusterVersions": _cluster_versions,
    "DescribeAddonVersions": _addon_versions,
    "DescribeAddonConfiguration": _addon_configuration,
    "DescribeCapacityReservations": _reservations,
    "GetServiceQuota": _quota,
}


def _keep_params(params: dict, model: Any, context: dict, **_: Any) -> None:
    if model.name in FACTS:
        context["walk_params"] = dict(params)


def _answer_facts(model: Any, context: dict, **_: Any) -> tuple[AWSResponse, dict] | None:
    fact = FACTS.get(model.name)
    if fact is None:
        return None
    try:
        parsed = fact(context["walk_params"])
        status = 200
    except _ClientError as exc:
        parsed = {"Error": {"Code": exc.code, "Message": str(exc)}}
        status = 400
    parsed["ResponseMetadata"] = {"HTTPStatusCode": status, "RetryAttempts": 0}
    return AWSResponse("https://aws.stand-in", status, {}, None), parsed


# -- the deploy: the template's resources the later steps use, and its outputs ---------------------


class Deployed:
    """One `cdk deploy` of a synthesized template into moto: physical ids for what the steps use."""

    def __init__(self, template: dict, *, stack: str) -> None:
        self.template = template
        self.stack = stack
        self.resources: dict[str, dict] = template["Resources"]
        self.physical: dict[str, str] = {}
        for logical, resource in self.resources.items():
            props = resource.get("Properties", {})
            name = props.get("RepositoryName") or props.get("Name") or props.get("BucketName")
            self.physical[logical] = name if isinstance(name, str) else f"{stack}-{logical.lower()}"[:60]

    def resolve(self, value: Any) -> Any:  # noqa: PLR0911 - one intrinsic per branch
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "Ref" in value:
            return {
                "AWS::URLSuffix": "amazonaws.com",
                "AWS::Region": REGION,
                "AWS::AccountId": ACCOUNT,
                "AWS::Partition": "aws",
                "AWS::StackName": self.stack,
            }.get(value["Ref"]) or self.physical.get(value["Ref"], "")
        if "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            logical, attribute = target.split(".", 1) if isinstance(target, str) else target
            return self._attribute(logical, str(attribute))
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return separator.join(str(self.resolve(p)) for p in self.resolve(parts))
        if "Fn::Select" in value:
            index, items = value["Fn::Select"]
            return self.resolve(items)[int(index)]
        if "Fn::Split" in value:
            separator, text = value["Fn::Split"]
            return str(self.resolve(text)).split(separator)
        return {k: self.resolve(v) for k, v in value.items()}

    def _attribute(self, logical: str, attribute: str) -> str:
        kind = self.resources.get(logical, {}).get("Type", "")
        name = self.physical.get(logical, logical)
        if kind == "AWS::ECR::Repository" and attribute == "Arn":
            return f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/{name}"
        if kind == "AWS::IAM::Role" and attribute == "Arn":
            return f"arn:aws:iam::{ACCOUNT}:role/{name}"
        return f"{name}-{attribute.lower()}"

    def failed_rules(self) -> list[str]:
        """What CloudFormation checks before it creates anything: each rule assertion that fails with
        the parameters at their defaults (the bootstrap stack's version: a current one)."""
        values = {name: p.get("Default") for name, p in self.template.get("Parameters", {}).items()}
        values["BootstrapVersion"] = "30"

        def holds(expression: Any) -> Any:
            if not isinstance(expression, dict):
                return expression
            ((function, argument),) = expression.items()
            if function == "Ref":
                return values[argument]
            arguments = [holds(a) for a in argument]
            return {
                "Fn::Not": lambda: not arguments[0],
                "Fn::Equals": lambda: arguments[0] == arguments[1],
                "Fn::Contains": lambda: arguments[1] in arguments[0],
            }[function]()

        return [
            assertion["AssertDescription"]
            for rule in self.template.get("Rules", {}).values()
            for assertion in rule["Assertions"]
            if not holds(assertion["Assert"])
        ]

    def outputs(self) -> dict[str, str]:
        return {key: str(self.resolve(o["Value"])) for key, o in self.template.get("Outputs", {}).items()}

    def of_type(self, kind: str) -> dict[str, dict]:
        return {k: r for k, r in self.resources.items() if r["Type"] == kind}

    def api_admits(self, address: str) -> bool:
        """Whether the cluster security group admits `address` on 443: the private endpoint's network
        interfaces carry that group, so nothing else reaches the API (being in the VPC is not enough)."""
        import ipaddress  # noqa: PLC0415

        (cluster,) = self.of_type("AWS::EKS::Cluster")
        group = {"Fn::GetAtt": [cluster, "ClusterSecurityGroupId"]}
        for rule in self.of_type("AWS::EC2::SecurityGroupIngress").values():
            props = rule["Properties"]
            if props["GroupId"] != group or props.get("IpProtocol") != "tcp" or "CidrIp" not in props:
                continue
            if props["FromPort"] <= 443 <= props["ToPort"] and ipaddress.ip_address(
                address
            ) in ipaddress.ip_network(props["CidrIp"]):
                return True
        return False

    def admin_principals(self) -> set[str]:
        """Principals an access entry of the template gives cluster admin."""
        found = set()
        for resource in self.of_type("AWS::EKS::AccessEntry").values():
            props = self.resolve(resource["Properties"])
            policies = [p.get("PolicyArn", "") for p in props.get("AccessPolicies", [])]
            if any(p.endswith("/AmazonEKSClusterAdminPolicy") for p in policies):
                found.add(props["PrincipalArn"])
        return found

    def create_in(self, session: boto3.Session) -> None:
        """What the later steps read: the repositories, the cluster, the roles, the stack's outputs."""
        ecr = session.client("ecr", region_name=REGION)
        for logical in self.of_type("AWS::ECR::Repository"):
            ecr.create_repository(repositoryName=self.physical[logical])
        s3 = session.client("s3", region_name=REGION)
        for logical in self.of_type("AWS::S3::Bucket"):
            s3.create_bucket(
                Bucket=self.physical[logical], CreateBucketConfiguration={"LocationConstraint": REGION}
            )
        iam = session.client("iam")
        trust = json.dumps({"Version": "2012-10-17", "Statement": []})
        for logical in self.of_type("AWS::IAM::Role"):
            with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):
                iam.create_role(RoleName=self.physical[logical], AssumeRolePolicyDocument=trust)
        eks = session.client("eks", region_name=REGION)
        for logical in self.of_type("AWS::EKS::Cluster"):
            eks.create_cluster(
                name=self.physical[logical],
                roleArn=f"arn:aws:iam::{ACCOUNT}:role/eks",
                resourcesVpcConfig={"subnetIds": []},
            )
        template = {
            "Resources": {"Placeholder": {"Type": "AWS::SNS::Topic"}},
            "Outputs": {key: {"Value": value} for key, value in self.outputs().items()},
        }
        session.client("cloudformation", region_name=REGION).create_stack(
            StackName=self.stack, TemplateBody=json.dumps(template)
        )


# -- the Kubernetes API of the deployed cluster ----------------------------------------------------


@dataclass
class StandInCluster:
    """The API server `job submit` / `job status` talk to: server-side apply stores objects, a Job's
    pods run where their images exist by digest and the node group has nodes for them."""

    session: boto3.Session
    admins: set[str] = field(default_factory=set)
    reachable: bool = False
    """Whether the user's network reaches the private endpoint (the deployed security group's 443 rules)."""
    nodes: int = 0
    objects: dict[tuple[str, str], dict] = field(default_factory=dict)

    def caller(self, headers: dict) -> str | None:
        """The IAM principal (role ARN for an assumed role) that signed the request's EKS token."""
        token = str(headers.get("Authorization", headers.get("authorization", ""))).removeprefix("Bearer ")
        if not token.startswith("k8s-aws-v1."):
            return None
        encoded = token.removeprefix("k8s-aws-v1.")
        url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        key = query.get("X-Amz-Credential", "").split("/", 1)[0]
        from moto.sts.models import sts_backends  # noqa: PLC0415

        for role in sts_backends[ACCOUNT]["global"].assumed_roles:
            if role.access_key_id == key:
                return role.role_arn
        return f"arn:aws:iam::{ACCOUNT}:user/walker"

    def image_exists(self, image: str) -> bool:
        name, _, digest = image.partition("@")
        if not digest:
            return False
        repository = name.split("/", 1)[1].rsplit(":", 1)[0]
        try:
            found = self.session.client("ecr", region_name=REGION).describe_images(
                repositoryName=repository, imageIds=[{"imageDigest": digest}]
            )["imageDetails"]
        except Exception:  # noqa: BLE001 - any answer but the image means it cannot be pulled
            return False
        return bool(found)

    def pods(self, namespace: str, selector: str) -> list[dict]:
        key, _, value = selector.partition("=")
        pods = []
        free = self.nodes
        for (kind, _), obj in sorted(self.objects.items()):
            meta = obj["metadata"]
            if meta.get("namespace") != namespace or meta.get("labels", {}).get(key) != value:
                continue
            spec = obj.get("spec", {})
            count = {"Job": spec.get("parallelism", 1), "Deployment": spec.get("replicas", 1)}.get(kind, 0)
            template = spec.get("template", {})
            gpu = kind == "Job"
            for index in range(int(count)):
                images = [c["image"] for c in template.get("spec", {}).get("containers", [])]
                pullable = all(self.image_exists(i) for i in images)
                scheduled = not gpu or free > 0
                free -= int(gpu and scheduled)
                pods.append(self._pod(obj, index, pullable=pullable, scheduled=scheduled))
        return pods

    @staticmethod
    def _pod(owner: dict, index: int, *, pullable: bool, scheduled: bool) -> dict:
        labels = owner["spec"]["template"]["metadata"].get("labels", {})
        state = (
            {"running": {}} if pullable else {"waiting": {"reason": "ErrImagePull", "message": "not found"}}
        )
        status: dict[str, Any] = {"phase": "Running" if pullable and scheduled else "Pending"}
        if scheduled:
            status["containerStatuses"] = [
                {
                    "name": "c",
                    "image": "",
                    "imageID": "",
                    "ready": pullable,
                    "restartCount": 0,
                    "state": state,
                }
            ]
        else:
            status["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no node"}
            ]
        return {
            "metadata": {
                "name": f"{owner['metadata']['name']}-{index}",
                "labels": labels,
                "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
            },
            "spec": {"nodeName": "ip-10-0-0-1" if scheduled else None, "containers": []},
            "status": status,
        }

    def handle(self, method: str, url: str, headers: dict, body: Any) -> tuple[int, Any]:  # noqa: PLR0911
        caller = self.caller(headers)
        if caller is None:
            return 401, {"kind": "Status", "message": "Unauthorized", "code": 401}
        if caller not in self.admins:
            return 403, {"kind": "Status", "message": f"{caller} has no access entry", "code": 403}
        parsed = urllib.parse.urlsplit(url)
        parts = parsed.path.strip("/").split("/")
        query = dict(urllib.parse.parse_qsl(parsed.query))
        namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts else ""
        if method == "PATCH":
            kind = body["kind"]
            self.objects[(kind, body["metadata"]["name"])] = body
            return 200, body
        if parts[-1] == "pods":
            items = self.pods(namespace, query.get("labelSelector", ""))
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        if "jobs" in parts and parts[-1] != "jobs":
            job = self.objects.get(("Job", parts[-1]))
            if job is None:
                return 404, {"kind": "Status", "message": f"jobs {parts[-1]!r} not found", "code": 404}
            return 200, {**job, "status": {"active": job["spec"].get("parallelism", 1)}}
        return 404, {"kind": "Status", "message": "not served by the stand-in", "code": 404}


# -- the walk --------------------------------------------------------------------------------------


class Walk:
    def __init__(self, *, cwd: Path, session: boto3.Session, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cwd = cwd
        self.session = session
        self.monkeypatch = monkeypatch
        self.cluster = StandInCluster(session=session)
        self.bootstrapped = False
        self.deployed: Deployed | None = None
        self.local_images: set[str] = set()
        self.printed_job_names: list[str] = []
        self.scaled: dict[str, int] = {}

    def run(self, step: Command | Edit) -> None:
        if isinstance(step, Edit):
            self._edit(step)
            return
        argv = [self._fill(word) for word in step.argv]
        handler = {
            "source": lambda _: None,
            "nvrx-eks": self._nvrx_eks,
            "npx": self._npx,
            "aws": self._aws,
            "cp": lambda a: shutil.copyfile(self.cwd / a[1], self.cwd / a[2]),
        }.get(argv[0])
        assert handler is not None, f"{step}: the walk has no stand-in for {argv[0]!r}"
        handler(argv)

    @staticmethod
    def _fill(word: str) -> str:
        for placeholder, value in PLACEHOLDERS.items():
            word = re.sub(rf"\b{placeholder}\b", value, word)
        return word

    def _edit(self, edit: Edit) -> None:
        path = self.cwd / edit.path
        data = yaml.safe_load(path.read_text())
        for dotted in edit.fields:
            leaf = dotted.rsplit(".", 1)[-1]
            assert leaf in USER_FIELDS, f"step {edit.step}: the walk does not know the user's {dotted}"
            node: Any = data
            parts = [int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", dotted) if p]
            for part in parts[:-1]:
                node = node[part]
            node[parts[-1]] = USER_FIELDS[leaf]
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    # nvrx-eks: the real commands, in process; the container engine is a stand-in
    def _nvrx_eks(self, argv: list[str]) -> None:
        from nvrx_eks import cli  # noqa: PLC0415

        if argv[1:3] == ["image", "pin"]:
            self._pin()
            return
        result = CliRunner().invoke(cli.app, argv[1:])
        self.output = result.output
        failure = f"{result.exception!r}" if result.exception and result.exit_code != 0 else ""
        assert result.exit_code == 0, f"exited {result.exit_code}:\n{result.output}{failure}"
        self.printed_job_names += re.findall(r"nvrx-eks job status (\S+)", result.output)
        if argv[1] == "values":
            self._check_values(Path(argv[argv.index("-o") + 1]))
        if argv[1:3] == ["image", "push"]:
            self._check_deployed_images()

    def _check_values(self, path: Path) -> None:
        """What `values` wrote is what `job submit` will run: images that are in the repository."""
        data = yaml.safe_load((self.cwd / path).read_text())
        for key in ("image", "store_image"):
            assert self.cluster.image_exists(str(data.get(key))), (
                f"{path} {key}: {data.get(key)} is not in the stack's repository by digest"
            )

    def _check_deployed_images(self) -> None:
        """Every image of the stack's repository the deployed objects name (the node check's) is
        there once the images are pushed."""
        assert self.deployed is not None, "image push before the deploy"
        uri = self.deployed.outputs()["ImageRepositoryUri"]
        text = json.dumps(self.deployed.resolve(self.deployed.resources))
        named = set(re.findall(rf"{re.escape(uri)}:([A-Za-z0-9_.-]+)", text))
        assert named, f"the deployed template names no image of {uri}"
        ecr = self.session.client("ecr", region_name=REGION)
        repository = uri.split("/", 1)[1]
        for tag in named:
            found = ecr.describe_images(repositoryName=repository, filter={"tagStatus": "TAGGED"})
            tags = {t for d in found["imageDetails"] for t in d.get("imageTags", [])}
            assert tag in tags, f"the deployed node check pulls {uri}:{tag}, which was never pushed"

    def _pin(self) -> None:
        """What `image pin` records in kitcore/pins.py: base digests, checksums, chart image digests."""

        def digest(text: str) -> str:
            return f"sha256:{hashlib.sha256(text.encode()).hexdigest()}"

        self.monkeypatch.setattr(
            pins,
            "IMAGE",
            dataclasses.replace(
                pins.IMAGE,
                base_digest=digest("base"),
                efa_installer_sha256=hashlib.sha256(b"efa").hexdigest(),
                aws_ofi_nccl_sha256=hashlib.sha256(b"ofi").hexdigest(),
            ),
        )
        self.monkeypatch.setattr(
            pins,
            "STORE_IMAGE",
            dataclasses.replace(
                pins.STORE_IMAGE, base_digest=digest("store"), torch_sha256=hashlib.sha256(b"t").hexdigest()
            ),
        )
        charts = {
            name: dataclasses.replace(
                chart,
                images=tuple(
                    dataclasses.replace(i, digest=digest(i.repository + i.tag)) for i in chart.images
                ),
            )
            for name, chart in cluster_pins.HELM_CHARTS.items()
        }
        self.monkeypatch.setattr(cluster_pins, "HELM_CHARTS", charts)

    def engine(self, argv: list[str], **_: Any) -> str:
        """The container engine: builds record the local image, pushes put a manifest into ECR."""
        verb = argv[1]
        if verb == "build":
            self.local_images.add(argv[argv.index("--tag") + 1])
        elif verb == "tag":
            assert argv[2] in self.local_images, f"`{shlex.join(argv)}`: {argv[2]} was never built"
            self.local_images.add(argv[3])
        elif verb == "push":
            assert argv[2] in self.local_images, f"`{shlex.join(argv)}`: {argv[2]} was never tagged"
            name, _, tag = argv[2].rpartition(":")
            manifest = {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "layers": [],
                "annotations": {"tag": tag},
            }
            self.session.client("ecr", region_name=REGION).put_image(
                repositoryName=name.split("/", 1)[1], imageManifest=json.dumps(manifest), imageTag=tag
            )
        return ""

    # npx cdk: bootstrap is recorded; deploy synthesizes the real app (its gate included) and deploys
    def _npx(self, argv: list[str]) -> None:
        assert argv[1] == "cdk", f"`{shlex.join(argv)}`: only the CDK is run with npx"
        if argv[2] == "bootstrap":
            assert argv[3] == f"aws://{ACCOUNT}/{REGION}", f"bootstrap of {argv[3]}, not {ACCOUNT}/{REGION}"
            self.bootstrapped = True
            return
        assert argv[2] == "deploy", f"`{shlex.join(argv)}`: the walk deploys only"
        assert self.bootstrapped, "cdk deploy before cdk bootstrap"
        context = dict(argv[i + 1].split("=", 1) for i, word in enumerate(argv) if word == "-c")
        import aws_cdk  # noqa: PLC0415

        from nvrx_eks.infra import app as infra_app  # noqa: PLC0415

        outdir = self.cwd / "cdk.out"
        # Where the CDK CLI would read the assembly (CDK_OUTDIR reaches only a jsii kernel started later).
        self.monkeypatch.setattr(aws_cdk, "App", functools.partial(aws_cdk.App, outdir=str(outdir)))
        self.monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", ACCOUNT)
        self.monkeypatch.setenv("NVRX_EKS_CDK_COMMAND", "deploy")
        try:
            infra_app.main(context)
        except SystemExit as exc:
            pytest.fail(f"`{shlex.join(argv)}` exited {exc.code} (its message is in the captured stderr)")
        finally:
            self.monkeypatch.delenv("NVRX_EKS_CDK_COMMAND")
        manifest = json.loads((outdir / "manifest.json").read_text())
        [stack] = [k for k, v in manifest["artifacts"].items() if v["type"] == "aws:cloudformation:stack"]
        template = json.loads((outdir / f"{stack}.template.json").read_text())
        self.deployed = Deployed(template, stack=stack)
        refused = self.deployed.failed_rules()
        assert not refused, f"CloudFormation refuses the template: {refused}"
        self.deployed.create_in(self.session)
        self.cluster.admins = self.deployed.admin_principals()
        self.cluster.reachable = self.deployed.api_admits(USER_ADDRESS)

    # aws: the one AWS CLI call of the steps, against the deployed stack
    def _aws(self, argv: list[str]) -> None:
        assert argv[1:3] == ["eks", "update-nodegroup-config"], f"no stand-in for `{shlex.join(argv)}`"
        assert self.deployed is not None, f"`{shlex.join(argv)}` before the deploy"
        options = dict(zip(argv[3::2], argv[4::2], strict=True))
        # The AWS CLI asks the Region the environment names, which is none (or another) here.
        assert options.get("--region") == REGION, "no --region: the AWS CLI would look in the default Region"
        outputs = self.deployed.outputs()
        assert options["--cluster-name"] == outputs["ClusterName"], f"no cluster {options['--cluster-name']}"
        groups = json.loads(outputs["GpuNodeGroups"])
        assert options["--nodegroup-name"] in groups, f"no node group {options['--nodegroup-name']}"
        scaling = dict(item.split("=") for item in options["--scaling-config"].split(","))
        self.cluster.nodes = int(scaling["desiredSize"])


@pytest.fixture
def walk(aws_env, monkeypatch, tmp_path):
    # No Region in the environment: every command that needs one must be given it by the README.
    for variable in ("AWS_REGION", "AWS_DEFAULT_REGION", "CDK_DEFAULT_REGION"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NVRX_EKS_STATE_DIR", str(tmp_path / ".nvrx-eks"))
    from nvrx_eks.infra.ops import charts  # noqa: PLC0415

    monkeypatch.setattr(charts, "http_get", _chart_repository)
    for folder in ("infra", "k8s", "images", "training", "kitcore"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    with mock_aws():
        session = boto3.Session(region_name=REGION)
        walker = Walk(cwd=tmp_path, session=session, monkeypatch=monkeypatch)
        original_client = AwsSession.client

        def client(self: AwsSession, service: str) -> Any:
            made = original_client(self, service)
            made.meta.events.register("before-parameter-build.*.*", _keep_params, unique_id="walk-params")
            made.meta.events.register("before-call.*.*", _answer_facts, unique_id="walk-facts")
            return made

        monkeypatch.setattr(AwsSession, "client", client)
        from nvrx_eks.images import commands as image_commands  # noqa: PLC0415

        monkeypatch.setattr(image_commands, "_run", walker.engine)
        monkeypatch.setattr(image_commands, "_engine", lambda engine, dry_run: engine or "docker")

        def request(
            _self: Any, method: str, url: str, headers: Any = None, body: Any = None, **_: Any
        ) -> Any:
            if not walker.cluster.reachable:
                reason = urllib3.exceptions.ConnectTimeoutError(None, f"{USER_ADDRESS} -> {url}: timed out")
                raise urllib3.exceptions.MaxRetryError(None, url, reason)  # type: ignore[arg-type]
            status, payload = walker.cluster.handle(method, url, dict(headers or {}), body)
            raw = urllib3.HTTPResponse(
                body=json.dumps(payload).encode(), status=status, headers={"Content-Type": "application/json"}
            )
            return RESTResponse(raw)

        monkeypatch.setattr(RESTClientObject, "request", request)
        # The stand-in answers at once: pods that do not run at the first poll never will.
        from nvrx_eks.infra.ops import jobs  # noqa: PLC0415

        wait = jobs.wait_for_pods
        monkeypatch.setattr(
            jobs,
            "wait_for_pods",
            lambda *a, **k: wait(*a, **{**k, "timeout_s": 0.0, "sleep": lambda _: None}),
        )
        from nvrx_eks import cli  # noqa: PLC0415

        if not cli.app.registered_groups[0].typer_instance.registered_commands:
            cli._register_all()
        yield walker


@pytest.mark.slow  # synthesizes the whole app
@pytest.mark.shareable
def test_the_readme_aws_steps_work_in_order(walk):
    steps = readme_steps((ROOT / "README.md").read_text())
    assert any(isinstance(s, Command) and s.argv[:3] == ["nvrx-eks", "job", "submit"] for s in steps)
    for step in steps:
        try:
            walk.run(step)
        except AssertionError as exc:
            raise AssertionError(f"{step}: {exc}") from None
        if isinstance(step, Command) and step.argv[:3] == ["nvrx-eks", "job", "status"]:
            # The name `job status` is given is the job's: the one `job submit` printed.
            assert walk.printed_job_names, f"{step}: `job submit` printed no job to follow"
            assert walk.printed_job_names[-1] in walk.output, step
    # The walk ends with the job's pods running on the cluster the README deployed.
    assert walk.cluster.objects, "no job was applied"
    assert os.environ.get("NVRX_EKS_CDK_COMMAND") is None


@pytest.mark.parametrize(
    "unpublished",
    [
        ("chart", "kueue", "0.19.99"),
        ("addon", "vpc-cni", "v9.9.9-eksbuild.1"),
    ],
)
def test_a_pin_nothing_publishes_fails_the_walk_at_preflight(walk, monkeypatch, unpublished):
    """The walk's account and chart repositories answer from the dated record, not from the pins: a pin
    the record does not list fails preflight, as it would fail against AWS."""
    from nvrx_eks.infra import cluster_pins  # noqa: PLC0415

    kind, name, version = unpublished
    if kind == "chart":
        moved = dataclasses.replace(cluster_pins.HELM_CHARTS[name], version=version)
        monkeypatch.setattr(cluster_pins, "HELM_CHARTS", {**cluster_pins.HELM_CHARTS, name: moved})
    else:
        pin = cluster_pins.EKS_ADDONS[name]
        versions = {k: dataclasses.replace(v, version=version) for k, v in pin.versions.items()}
        moved = dataclasses.replace(pin, versions=versions)
        monkeypatch.setattr(cluster_pins, "EKS_ADDONS", {**cluster_pins.EKS_ADDONS, name: moved})
    steps = readme_steps((ROOT / "README.md").read_text())
    with pytest.raises(AssertionError, match=rf"(?s)nvrx-eks preflight.*exited 3.*{re.escape(version)}"):
        _run_all(walk, steps)


def _run_all(walk: Walk, steps: list[Command | Edit]) -> None:
    for step in steps:
        try:
            walk.run(step)
        except AssertionError as exc:
            raise AssertionError(f"{step}: {exc}") from None


def test_the_walk_reads_every_command_of_the_block():
    steps = readme_steps((ROOT / "README.md").read_text())
    commands = [s for s in steps if isinstance(s, Command)]
    # Every command runs under a numbered step, and the first and last steps are there.
    assert commands[0].argv[0] == "source"
    assert {s.step for s in commands} >= {"0", "6"}
    assert all(c.argv[0] in {"source", "nvrx-eks", "npx", "aws", "cp"} for c in commands), commands


def test_the_deploy_stand_in_refuses_what_cloudformation_rules_refuse():
    gate = {"Fn::Not": [{"Fn::Equals": [{"Ref": "PreflightPass"}, "none"]}]}
    template = {
        "Resources": {},
        "Parameters": {"PreflightPass": {"Type": "String", "Default": "none"}},
        "Rules": {"PreflightPassed": {"Assertions": [{"Assert": gate, "AssertDescription": "no pass"}]}},
    }
    assert Deployed(template, stack="s").failed_rules() == ["no pass"]
    template["Parameters"]["PreflightPass"]["Default"] = "given"
    assert Deployed(template, stack="s").failed_rules() == []
