"""HostAccess: which commands, variables, local locations and notification targets a
gateway with auth: accepts; FileRoots, the guard the stores open local files through."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shipyard.errors import (
    ArtifactError,
    InvalidParameter,
    NoSuchObject,
    ObjectStoreError,
    OutsideFileRoots,
)
from shipyard.host_access import HostAccess, environment_refusal, wildcard
from shipyard.stackfile import AccessKey, AuthConfig
from shipyard.storage.artifacts import ArtifactStore
from shipyard.storage.filesystems import FileRoots, Filesystems, local_location, local_path
from shipyard.storage.objects import ObjectStore


def access(tmp_path: Path, **kw: object) -> HostAccess:
    key = AccessKey(access_key_id="AKIATEST", secret_access_key_env="X")
    return HostAccess.from_auth(AuthConfig(keys=[key], file_roots=[tmp_path / "root"], **kw))


def test_without_auth_everything_is_allowed(tmp_path: Path) -> None:
    open_access = HostAccess.from_auth(None)
    open_access.check_process(
        image="cmd:id", entrypoint=["sh"], environment={"LD_PRELOAD": "/x.so", "PATH": "/"}
    )
    open_access.check_location("file:///etc/passwd", "ModelDataUrl")
    open_access.check_notify_target("json://10.0.0.1/hook", "SuccessTopic")


def test_with_auth_commands_are_refused_unless_allowed(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match=r"PrimaryContainer\.Image.*allow_commands"):
        access(tmp_path).check_process(
            image="cmd:id > /tmp/x", image_field="PrimaryContainer.Image"
        )
    with pytest.raises(InvalidParameter, match="ContainerEntrypoint"):
        access(tmp_path).check_process(entrypoint=["sh"])
    access(tmp_path).check_process(image="shipyard/python")
    access(tmp_path, allow_commands=True).check_process(image="cmd:id", entrypoint=["sh"])


@pytest.mark.parametrize(
    "uri",
    [
        "ROOT/model.tar.gz",
        "file://ROOT/model.tar.gz",
        "file://localhost/ROOT/sub/not-yet-made/out",
        "file://ROOT/a%20b/model.tar.gz",
        "FILE://ROOT/model.tar.gz",
        "ROOT",
        "s3://bucket/anything",
        "http://example.com/opens/no/local/file",
    ],
)
def test_locations_under_a_root_or_in_s3_are_accepted(tmp_path: Path, uri: str) -> None:
    (tmp_path / "root").mkdir()
    access(tmp_path).check_location(uri.replace("ROOT", str(tmp_path / "root")), "S3Uri")


@pytest.mark.parametrize(
    "uri",
    [
        "/etc/hostname",
        "file:///etc/hostname",
        "FILE:///etc/hostname",
        " file:///etc/hostname",
        "\nfile:///etc/hostname",
        "fi\tle:///etc/hostname",
        "File:/etc/hostname",
        "ROOT/../outside",
        "file://ROOT/%2E%2E/outside",
        "ROOT-evil/model.tar.gz",
        "ROOT/link-out/secret",
        "ROOT/not-yet/../../outside",
    ],
)
def test_locations_outside_the_roots_are_refused(tmp_path: Path, uri: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    (root / "link-out").symlink_to(tmp_path / "outside")
    with pytest.raises(InvalidParameter, match=r"S3Uri: .*auth\.file_roots"):
        access(tmp_path).check_location(uri.replace("ROOT", str(root)), "S3Uri")


def test_the_check_reads_a_location_as_the_opener_does() -> None:
    """Finding 5: the check and the opener once parsed ``FILE:///etc/x`` apart."""
    for uri in ("FILE:///etc/x", " file:///etc/x", "fi\tle:///etc/x", "file:/etc/x"):
        assert local_location(uri) == local_path(uri) == Path("/etc/x")
    assert local_path("file:///a/b%20c") == Path("/a/b c")
    assert local_location("s3://b/k") is None
    assert local_location("file://otherhost/x") is None  # the stores refuse it too
    assert local_location("https://x/y") is None


def test_no_roots_means_no_local_locations(tmp_path: Path) -> None:
    key = AccessKey(access_key_id="AKIATEST", secret_access_key_env="X")
    strict = HostAccess.from_auth(AuthConfig(keys=[key]))
    with pytest.raises(InvalidParameter, match="none"):
        strict.check_location(str(tmp_path), "ModelDataUrl")
    strict.check_location("s3://b/k", "ModelDataUrl")


def test_a_nul_in_a_path_is_a_validation_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match="NUL"):
        access(tmp_path).check_location("file:///srv/a\x00b", "CheckpointConfig.S3Uri")


# -- environment --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["PYTHONWARNINGS", "PYTHONPATH", "LD_PRELOAD", "BROWSER", "BASH_ENV", "ENV", "PERL5OPT",
     "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "GCONV_PATH", "PATH", "HOME", "http_proxy",
     "AWS_CONFIG_FILE", "BASH_FUNC_x%%", "pythonstartup"],
)  # fmt: skip
def test_interpreter_variables_are_refused_even_when_allowed(name: str) -> None:
    allowed = (wildcard("*"),)
    for allow_commands in (False, True):
        why = environment_refusal(name, allow_commands=allow_commands, allowed=allowed)
        assert why is not None, name


@pytest.mark.parametrize(
    "name",
    ["SAGEMAKER_PROGRAM", "SAGEMAKER_TS_BATCH_SIZE", "SHIPYARD_MAX_BATCH_SIZE", "SM_NUM_GPUS",
     "TS_DEFAULT_RESPONSE_TIMEOUT", "MMS_DEFAULT_WORKERS_PER_MODEL", "HF_TASK",
     "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT"],
)  # fmt: skip
def test_sagemaker_variables_are_allowed(name: str) -> None:
    assert environment_refusal(name, allow_commands=False) is None


def test_other_variables_need_allow_environment_or_commands() -> None:
    assert environment_refusal("MY_FLAG", allow_commands=False) is not None
    assert environment_refusal("MY_FLAG", allow_commands=True) is None
    allowed = (wildcard("MY_*"), wildcard("OTHER"))
    assert environment_refusal("MY_FLAG", allow_commands=False, allowed=allowed) is None
    assert environment_refusal("OTHER", allow_commands=False, allowed=allowed) is None
    assert environment_refusal("OTHERS", allow_commands=False, allowed=allowed) is not None


def test_the_gateways_own_variables_and_odd_names_are_refused() -> None:
    for name in ("SHIPYARD_IMPORTS_FILE", "SHIPYARD_MODEL_PREFIX", "A=B", "", "1X"):
        assert environment_refusal(name, allow_commands=True) is not None, name


def test_check_process_names_the_variable(tmp_path: Path) -> None:
    checked = access(tmp_path, allow_environment=["TEAM_*", "PYTHONPATH"])
    checked.check_process(environment={"SAGEMAKER_PROGRAM": "x.py", "TEAM_MODE": "fast"})
    for name in ("PYTHONWARNINGS", "LD_PRELOAD", "BROWSER", "PYTHONPATH", "FOO"):
        with pytest.raises(InvalidParameter, match=rf"Containers\.2\.Environment: '{name}'"):
            checked.check_process(
                environment={name: "x"}, environment_field="Containers.2.Environment"
            )


def test_a_submit_directory_variable_is_a_location(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    checked = access(tmp_path)
    checked.check_process(environment={"SAGEMAKER_SUBMIT_DIRECTORY": str(tmp_path / "root")})
    checked.check_process(environment={"SAGEMAKER_SUBMIT_DIRECTORY": "s3://b/code.tar.gz"})
    with pytest.raises(InvalidParameter, match=r"SAGEMAKER_SUBMIT_DIRECTORY: .*file_roots"):
        checked.check_process(environment={"SAGEMAKER_SUBMIT_DIRECTORY": "FILE:///etc"})


# -- notification targets -----------------------------------------------------------


def test_notify_targets_match_whole_urls_with_star_only(tmp_path: Path) -> None:
    checked = access(
        tmp_path,
        notify_targets=[
            "https://hooks.example.com/*",
            "https://hooks.example.com/q?*",
            "mailto://ops@mail.example?x",
        ],
    )
    checked.check_notify_target("https://hooks.example.com/team/a", "SuccessTopic")
    checked.check_notify_target("https://hooks.example.com/q?x=1", "SuccessTopic")
    checked.check_notify_target("mailto://ops@mail.example?x", "SuccessTopic")
    checked.check_notify_target("done", "SuccessTopic")  # a topic: the operator's
    checked.check_notify_target("arn:aws:sns:us-east-1:123456789012:done", "SuccessTopic")
    for url in (
        "http://hooks.example.com/x",
        "https://hooks.example.com.evil.net/x",
        "json://10.0.0.1/hook",
        "mailto://ops@mail.exampleAx",  # '?' is literal, not any one character
        "xhttps://hooks.example.com/",
        "https://hooks.example.com/team/a?x=1",  # a query only where the pattern has one
        "https://hooks.example.com/a#x",
    ):
        with pytest.raises(InvalidParameter, match="ErrorTopic: .*auth.notify_targets"):
            checked.check_notify_target(url, "ErrorTopic")


def test_no_notify_targets_means_no_urls(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match=r"'json://u:\*\*\*\*@h/'"):
        access(tmp_path).check_notify_target("json://u:secret@h/", "SuccessTopic")


# -- the guard in the stores ---------------------------------------------------------


def guarded(tmp_path: Path) -> Filesystems:
    return Filesystems(file_roots=FileRoots([tmp_path / "root"]))


def test_file_roots_resolve_links_and_dots(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "out").symlink_to(tmp_path)
    roots = FileRoots([root])
    assert roots.check(root / "a" / "b", "x") == root / "a" / "b"
    for path in (root / "out" / "x", root / "a" / ".." / ".." / "x", tmp_path / "rootx"):
        with pytest.raises(OutsideFileRoots, match="auth.file_roots"):
            roots.check(path, str(path))


@contextlib.contextmanager
def swapping(link: Path, *targets: Path) -> Iterator[None]:
    """``link`` pointed at each of ``targets`` in turn, over and over, by a thread (what
    a job can do in its own output folder) while the block runs."""
    stop = threading.Event()

    def swap() -> None:
        spare = link.with_name(".spare")
        while not stop.is_set():
            for target in targets:
                spare.symlink_to(target)
                spare.replace(link)

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        yield
    finally:
        stop.set()
        swapper.join()


def test_a_link_swapped_while_an_object_is_read_never_leaks(tmp_path: Path) -> None:
    """The object store opens a local object, then checks the file it holds: a transform
    or async input under a root that a job keeps swapping never reads the secret."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "decoy.txt").write_text("decoy")
    (tmp_path / "secret.txt").write_text("SECRET")
    link = root / "input.txt"
    link.symlink_to(root / "decoy.txt")
    store = ObjectStore(filesystems=guarded(tmp_path))
    read: list[bytes] = []
    with swapping(link, tmp_path / "secret.txt", root / "decoy.txt"):
        for _ in range(300):
            try:
                read.append(store.read_bytes(link.as_uri(), limit=100))
            except (ObjectStoreError, NoSuchObject):
                continue
    assert b"SECRET" not in read
    (root / ".spare").symlink_to(root / "decoy.txt")
    (root / ".spare").replace(link)
    assert store.read_bytes(link.as_uri(), limit=100) == b"decoy"  # a still link reads


def test_the_gateways_home_is_no_callers_even_under_a_root(tmp_path: Path) -> None:
    """A later review: a root containing the gateway's home let a job plant links to the
    store and other endpoints' logs, which a model's copy then followed."""
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    (home / "shipyard.db").write_text("the store")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "db").symlink_to(home / "shipyard.db")
    roots = FileRoots([tmp_path], hidden=[home])
    for path in (home, home / "shipyard.db", home / "logs" / "x", tmp_path / "model" / "db"):
        with pytest.raises(OutsideFileRoots, match="gateway's home"):
            roots.check(path, str(path))
    assert roots.check(tmp_path / "model", "m") == tmp_path / "model"
    store = ArtifactStore(filesystems=Filesystems(file_roots=roots))
    with pytest.raises(ArtifactError, match="auth.file_roots"):
        store.fetch_model(str(tmp_path / "model"), tmp_path / "cache" / "m")


def test_the_object_store_opens_nothing_outside_the_roots(tmp_path: Path) -> None:
    """Findings 3 and 5: whatever route a location took, the store refuses it."""
    (tmp_path / "root").mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    store = ObjectStore(filesystems=guarded(tmp_path))
    inside = (tmp_path / "root" / "in.txt").as_uri()
    asyncio.run(store.write_bytes(inside, b"ok"))
    assert store.read_bytes(inside, limit=10) == b"ok"
    escapes = [
        secret.as_uri(),
        "FILE://" + str(secret),
        " " + secret.as_uri(),
        (tmp_path / "root").as_uri() + "/../secret.txt",
    ]
    with pytest.raises(ObjectStoreError, match="would leave it"):
        store.join((tmp_path / "root").as_uri(), "../secret.txt")
    for uri in escapes:
        with pytest.raises(ObjectStoreError, match="auth.file_roots"):
            store.read_bytes(uri, limit=10)
        with pytest.raises(ObjectStoreError, match="auth.file_roots"):
            asyncio.run(store.write_bytes(uri + ".out", b"x"))
        with pytest.raises(ObjectStoreError, match="auth.file_roots"):
            store.delete(uri)
    assert not list(tmp_path.glob("*.out")) and secret.read_text() == "secret"


@pytest.mark.parametrize("prefix", ["file", "path"])
def test_a_name_joined_to_a_location_stays_a_name_under_it(tmp_path: Path, prefix: str) -> None:
    # Findings of a later review: '%2F' read as '/' and '#' as a fragment's start let an
    # InferenceId or an input object's name write outside the folder it was joined to.
    (tmp_path / "root" / "out").mkdir(parents=True)
    (tmp_path / "root" / "model.bin").write_text("weights")
    store = ObjectStore(filesystems=guarded(tmp_path))
    out = tmp_path / "root" / "out"
    base = out.as_uri() if prefix == "file" else str(out)
    names = ["..%2Fmodel.bin#", "a#1", "a?b", "50% off", "sub/x y"]
    for name in names:
        asyncio.run(store.write_bytes(store.join(base, name) + ".out", name.encode()))
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(f"{name}.out" for name in names)
    assert (tmp_path / "root" / "model.bin").read_text() == "weights"
    for name in ["..", "a/../../x", "./a"]:
        with pytest.raises(ObjectStoreError, match="would leave it"):
            store.join(base, name)


def test_the_artifact_store_follows_no_link_out_of_the_roots(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "model").mkdir(parents=True)
    (root / "model" / "weights.bin").write_text("w")
    (tmp_path / "secret.txt").write_text("secret")
    store = ArtifactStore(filesystems=guarded(tmp_path))
    assert store.download(str(root / "model"), tmp_path / "copy") == 1
    (root / "model" / "leak").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(ArtifactError, match="auth.file_roots"):
        store.fetch_model(str(root / "model"), tmp_path / "cache" / "m")
    with pytest.raises(ArtifactError, match="auth.file_roots"):
        store.fetch_model(str(tmp_path / "secret.txt"), tmp_path / "cache" / "n")
    with pytest.raises(ArtifactError, match="auth.file_roots"):
        store.upload_file(root / "model" / "weights.bin", (tmp_path / "dropped").as_uri())
    assert not (tmp_path / "cache" / "m").exists() and not (tmp_path / "dropped").exists()


def test_a_link_swapped_while_a_model_folder_is_copied_never_leaks(tmp_path: Path) -> None:
    """A later review: the copy checked a file's path, then opened it again; a job
    swapping a link in its own output folder (under a root) between a harmless file and
    a secret got the secret copied into a model. Each file is now checked once open."""
    root = tmp_path / "root"
    (root / "model").mkdir(parents=True)
    (root / "decoy.txt").write_text("decoy")
    (tmp_path / "secret.txt").write_text("SECRET")
    link = root / "model" / "s"
    link.symlink_to(root / "decoy.txt")
    store = ArtifactStore(filesystems=guarded(tmp_path))
    copied: list[str] = []
    with swapping(link, tmp_path / "secret.txt", root / "decoy.txt"):
        for n in range(60):
            try:
                folder = store.fetch_model(str(root / "model"), tmp_path / "cache" / str(n))
            except ArtifactError:
                continue
            copied.append((folder / "s").read_text())
    assert "SECRET" not in copied
    link.unlink()
    os.mkfifo(root / "model" / "pipe")  # no regular file: refused, not waited on
    with pytest.raises(ArtifactError, match="no regular file"):
        store.fetch_model(str(root / "model"), tmp_path / "cache" / "fifo")


def test_the_gateways_own_folders_are_not_checked(tmp_path: Path) -> None:
    """A destination given as a Path (a cache slot in the gateway's home) is its own."""
    root = tmp_path / "root"
    (root / "model").mkdir(parents=True)
    (root / "model" / "weights.bin").write_text("w")
    store = ArtifactStore(filesystems=guarded(tmp_path))
    home = tmp_path / "home" / "cache" / "m"
    assert store.fetch_model((root / "model").as_uri(), home) == home


def test_the_sdks_model_code_path_names_the_model_not_a_host_file(tmp_path):
    checked = access(tmp_path)
    checked.check_process(environment={"SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code"})
    with pytest.raises(InvalidParameter, match="file_roots"):
        checked.check_process(
            environment={"SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code/../../../../etc"}
        )


def test_a_star_never_reaches_past_its_part_of_the_url(tmp_path: Path) -> None:
    """apprise reads the mail server from the host and from ``smtp=`` in the query: a
    pattern naming the domain must hold against both."""
    checked = access(tmp_path, notify_targets=["mailto://*@example.com*"])
    checked.check_notify_target("mailto://ops@example.com", "SuccessTopic")
    for url in (
        "mailto://attacker@evil.test/?x=@example.com",
        "mailto://attacker@evil.test/@example.com",
        "mailto://a@example.com?smtp=evil.test&to=a@evil.test",
    ):
        with pytest.raises(InvalidParameter, match="auth.notify_targets"):
            checked.check_notify_target(url, "SuccessTopic")


def test_a_call_that_only_uses_a_model_may_not_choose_its_code(tmp_path: Path) -> None:
    checked = access(tmp_path)
    checked.check_process(environment={"SAGEMAKER_PROGRAM": "serve.py"})  # CreateModel
    for name in (
        "SAGEMAKER_PROGRAM",
        "SAGEMAKER_SUBMIT_DIRECTORY",
        "SHIPYARD_INSTALL_REQUIREMENTS",
    ):
        with pytest.raises(InvalidParameter, match=f"'{name}' chooses the code"):
            checked.check_process(environment={name: "x"}, chooses_code=False)
    access(tmp_path, allow_commands=True).check_process(
        environment={"SAGEMAKER_PROGRAM": "serve.py"}, chooses_code=False
    )


def test_container_images_need_allow_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHIPYARD_FRAMEWORK_IMAGES", raising=False)
    checked = access(tmp_path, allow_images=["registry.example.com/team/*", "python:3.12"])
    framework = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-inference:2.1-cpu-py310"
    for image in ("shipyard/python", framework, "registry.example.com/team/a:1", "python:3.12"):
        checked.check_process(image=image)
    for image in (
        "python:3.13",
        "registry.example.com/teams/a:1",
        "evil/registry.example.com/team/",
    ):
        with pytest.raises(InvalidParameter, match=rf"Image: the container image '{image}'"):
            checked.check_process(image=image)
    with pytest.raises(InvalidParameter, match="auth.allow_images"):
        access(tmp_path).check_process(image="registry.example.com/team/a:1")
    # Served as a container, a framework image is one like any other.
    monkeypatch.setenv("SHIPYARD_FRAMEWORK_IMAGES", "container")
    with pytest.raises(InvalidParameter, match="pytorch-inference"):
        checked.check_process(image=framework)
    HostAccess.from_auth(None).check_process(image="python:3.13")


def test_the_gateways_own_variables_are_refused_without_auth_too() -> None:
    open_access = HostAccess.from_auth(None)
    for name in ("SHIPYARD_ADAPTERS_TOKEN", "SHIPYARD_ADAPTERS_TOKEN_FD", "SAGEMAKER_BIND_TO_PORT"):
        with pytest.raises(InvalidParameter, match=rf"Environment: '{name}' is the gateway's own"):
            open_access.check_process(environment={name: "x"})
    open_access.check_process(environment={"SHIPYARD_TASK": "embeddings", "LD_PRELOAD": "/x"})
