"""The git reconciler: does a commit, tag or ref exist in a repository (local path or remote)?

Runs the `git` CLI without a shell, with a timeout that kills git and its helpers, no
terminal prompts, and only the file, git, ssh and http(s) transports.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from django.conf import settings
from pydantic import AfterValidator, Field, StringConstraints, model_validator

from durability import inbound
from durability.reconcilers import destinations
from durability.reconcilers.base import (
    Answer,
    Found,
    NotFound,
    ProbeConfig,
    Reconciler,
    Unknown,
    template_check,
    template_fill,
)

if TYPE_CHECKING:
    from durability.models import Effect

Template = Annotated[
    str, StringConstraints(min_length=1, max_length=1000), AfterValidator(template_check)
]

SHA = re.compile(r"^[0-9a-f]{4,64}$")
# Remote repositories are named by URL (scheme://…) or scp-like syntax (user@host:path).
REMOTE = re.compile(r"^[a-z][a-z0-9+.-]*://|^[^/:]+@[^/:]+:")
SCP = re.compile(
    r"^(?P<user>[^/:@]+)@(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(?P<path>.*)$", re.S
)
# The ports of the network transports; file:// reaches no network.
PORTS = {"http": 80, "https": 443, "ssh": 22, "git": 9418}


def _repository(template: str) -> str:
    """A repository template whose destination the agent's data cannot choose: literal
    up to a remote's host (https://host/…, git@host:…), or a local path (a / before any
    field, and no : before that /, which git would read as a host)."""
    prefix, fields = destinations.literal_prefix(template)
    if not fields:
        return template
    if REMOTE.match(prefix):
        return destinations.authority_check(template) if "://" in prefix else template
    head = prefix.split("/", 1)[0]
    if "/" in prefix and ":" not in head:
        return template
    raise ValueError(
        "the repository's host (or a local path's first directory) must be written out: "
        "https://git.example.com/{request[repo]}.git, git@host:org/{request[repo]}.git, "
        "/srv/repos/{request[repo]}.git"
    )


@dataclass(frozen=True)
class Remote:
    """How git reaches a remote: its URL with the host's checked address in it (or, for
    http(s), the name pinned to that address in curl), and the environment that says so."""

    url: str
    env: dict[str, str] = field(default_factory=dict)


def remote(repository: str, timeout: float) -> Remote:
    """The remote at its one checked address; raises destinations.Refused."""
    if scp := SCP.match(repository):
        host = scp["host"].strip("[]")
        address = destinations.resolve(host, PORTS["ssh"], timeout)
        return Remote(f"{scp['user']}@{_bracketed(address)}:{scp['path']}", _ssh_alias(host))
    parts = urlsplit(repository)
    if parts.scheme == "file":
        return Remote(Path(local_check(unquote(parts.path))).as_uri())
    if parts.scheme not in PORTS or not parts.hostname:
        raise destinations.Refused(f"{parts.scheme}:// names no host git may reach")
    host, port = parts.hostname, parts.port or PORTS[parts.scheme]
    address = destinations.resolve(host, port, timeout)
    if parts.scheme in ("http", "https"):
        # curl connects to the checked address for the name (TLS still checks the name),
        # and follows no redirect to another host.
        pinned = f"{host}:{port}:{_bracketed(address)}"
        config = {"http.curloptResolve": pinned, "http.followRedirects": "false"}
        env = {"GIT_CONFIG_COUNT": str(len(config))}
        for n, (key, value) in enumerate(config.items()):
            env |= {f"GIT_CONFIG_KEY_{n}": key, f"GIT_CONFIG_VALUE_{n}": value}
        return Remote(repository, env)
    user = f"{parts.username}@" if parts.username else ""
    netloc = f"{user}{_bracketed(address)}" + (f":{parts.port}" if parts.port else "")
    url = urlunsplit(parts._replace(netloc=netloc))
    return Remote(url, _ssh_alias(host) if parts.scheme == "ssh" else {})


def local_check(path: str) -> str:
    """The real path of a local repository (a path, or a file: URL's path) that lies under
    one of TALLYBOOK_RECONCILER_GIT_ROOTS, symlinks resolved; raises destinations.Refused.
    No root is listed by default: then no local repository is read at all, so that neither
    a project admin nor an agent's data can make the server read a repository on its disk
    (another project's, or the server's own)."""
    roots = [Path(os.path.realpath(root)) for root in settings.TALLYBOOK_RECONCILER_GIT_ROOTS]
    if not roots:
        raise destinations.Refused(
            "local repositories are read only under TALLYBOOK_RECONCILER_GIT_ROOTS, "
            "which lists none"
        )
    if ".." in re.split(r"[/\\]", path):
        raise destinations.Refused(f"{path!r} has a .. segment")
    if not os.path.isabs(path):
        raise destinations.Refused(f"{path!r} is not an absolute path")
    real = Path(os.path.realpath(path))
    if not any(real.is_relative_to(root) for root in roots):
        raise destinations.Refused(
            f"{path} is not under a directory of TALLYBOOK_RECONCILER_GIT_ROOTS"
        )
    return str(real)


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _ssh_alias(host: str) -> dict[str, str]:
    # ssh connects to the address; its host key is still looked up under the name.
    command = os.environ.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    return {"GIT_SSH_COMMAND": f"{command} -o HostKeyAlias={shlex.quote(host)}"}


class GitConfig(ProbeConfig):
    repository: Annotated[Template, AfterValidator(_repository)] = Field(
        description="Local path or remote URL, e.g. /srv/repos/site.git or "
        "https://git.example.com/{request[repo]}.git"
    )
    commit: Template | None = Field(default=None, description="A commit sha, e.g. {request[sha]}")
    tag: Template | None = Field(default=None, description="A tag name, e.g. v{request[version]}")
    ref: Template | None = Field(
        default=None, description="A full ref name, e.g. refs/heads/release-{key}"
    )
    system: str = "git"
    timeout_s: Annotated[float, Field(gt=0, le=600)] = 30.0

    @model_validator(mode="after")
    def _one_question(self) -> GitConfig:
        if sum(x is not None for x in (self.commit, self.tag, self.ref)) != 1:
            raise ValueError("give exactly one of commit, tag or ref")
        return self


class GitFailed(Exception):
    pass


def git(
    *args: str, timeout: float, cwd: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run git (`env` added to the environment); raises GitFailed when it cannot run or
    outlives `timeout`."""
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "file:git:ssh:http:https",
        "GIT_SSH_COMMAND": os.environ.get("GIT_SSH_COMMAND", "ssh -o BatchMode=yes"),
        "LC_ALL": "C",
        **(env or {}),
    }
    try:
        # A session of its own, so that a timeout kills git's helpers (ssh, remote-https) too.
        proc = subprocess.Popen(
            ["git", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        raise GitFailed(f"cannot run git: {exc}") from exc
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise GitFailed(f"git {args[0]} took longer than {timeout:g}s") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _reached(repository: str, timeout: float) -> Remote:
    try:
        return remote(repository, timeout)
    except destinations.Refused as exc:
        raise GitFailed(f"refused: {exc}") from None


def _ceiling(path: str) -> dict[str, str]:
    """Git looks for the repository in `path` itself, never in a directory above it."""
    return {"GIT_CEILING_DIRECTORIES": os.path.dirname(path)}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


class GitReconciler(Reconciler[GitConfig]):
    kind = "git"
    Config = GitConfig

    def probe(self, effect: Effect) -> Answer:
        c = self.config
        try:
            repository = template_fill(c.repository, effect, escape=False)
            what, name = self._question(effect)
        except (KeyError, IndexError, TypeError) as exc:
            return Unknown(f"a template names {exc} which this effect's request lacks")
        except ValueError as exc:
            return Unknown(str(exc))
        if repository.startswith("-"):
            return Unknown(f"{repository!r} is not a repository")
        try:
            if what == "commit":
                return self._commit(repository, name)
            return self._ref(repository, name)
        except GitFailed as exc:
            return Unknown(f"{repository}: {exc}")

    def _question(self, effect: Effect) -> tuple[Literal["commit", "ref"], str]:
        """What to look for: a commit sha, or a full ref name (tags become refs/tags/…)."""
        c = self.config
        if c.commit is not None:
            sha = template_fill(c.commit, effect, escape=False).strip().lower()
            if not SHA.match(sha):
                raise ValueError(f"{sha!r} is not a commit sha")
            return "commit", sha
        if c.tag is not None:
            name = "refs/tags/" + template_fill(c.tag, effect, escape=False)
        else:
            assert c.ref is not None
            name = template_fill(c.ref, effect, escape=False)
        checked = git("check-ref-format", name, timeout=self.config.timeout_s)
        if checked.returncode != 0 or not name.startswith("refs/"):
            raise ValueError(f"{name!r} is not a valid ref name")
        return "ref", name

    def _found(self, repository: str, sha: str, ref: str | None, git_dir: str) -> Found:
        shown = git(
            "show", "-s", "--format=%cI", "--end-of-options", sha,
            cwd=git_dir, timeout=self.config.timeout_s, env=_ceiling(git_dir),
        )  # fmt: skip
        observed = shown.stdout.strip() if shown.returncode == 0 else None
        try:
            observed_at = inbound.provider_time(observed)
        except ValueError as exc:
            raise GitFailed(
                f"commit {sha} has the committer date {observed!r:.60}: {exc}"
            ) from None
        data = {"repository": repository, "commit": sha} | ({"ref": ref} if ref else {})
        return Found(system=self.config.system, external_id=sha, observed_at=observed_at, data=data)

    def _commit(self, repository: str, sha: str) -> Answer:
        if not REMOTE.match(repository):
            return self._commit_in(repository, sha, self._local(repository))
        # A remote can only be asked for its refs: fetch their commits (no trees, no
        # blobs) into a scratch repository and look there. A commit no ref reaches
        # does not exist as far as anyone cloning the repository can tell.
        with tempfile.TemporaryDirectory(prefix="tallybook-git-") as scratch:
            timeout = self.config.timeout_s
            reached = _reached(repository, self.config.timeout_s)
            git("init", "--quiet", "--bare", scratch, timeout=timeout)
            fetched = git(
                "fetch", "--quiet", "--filter=tree:0", "--no-write-fetch-head", "--", reached.url,
                "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*",
                cwd=scratch, timeout=timeout, env=reached.env,
            )  # fmt: skip
            if fetched.returncode != 0:
                raise GitFailed(f"fetch failed: {_last_line(fetched.stderr)}")
            return self._commit_in(repository, sha, scratch)

    def _commit_in(self, repository: str, sha: str, git_dir: str) -> Answer:
        self._check_repository(git_dir)
        found = git(
            "rev-parse", "--quiet", "--verify", "--end-of-options", f"{sha}^{{commit}}",
            cwd=git_dir, timeout=self.config.timeout_s, env=_ceiling(git_dir),
        )  # fmt: skip
        if found.returncode != 0:
            return NotFound(f"{repository} has no commit {sha}")
        return self._found(repository, found.stdout.strip(), None, git_dir)

    def _ref(self, repository: str, ref: str) -> Answer:
        if REMOTE.match(repository):
            return self._remote_ref(repository, ref)
        git_dir = self._local(repository)
        found = git(
            "rev-parse", "--quiet", "--verify", "--end-of-options", f"{ref}^{{commit}}",
            cwd=git_dir, timeout=self.config.timeout_s, env=_ceiling(git_dir),
        )  # fmt: skip
        if found.returncode != 0:
            return NotFound(f"{repository} has no {ref}")
        return self._found(repository, found.stdout.strip(), ref, git_dir)

    def _remote_ref(self, repository: str, ref: str) -> Answer:
        reached = _reached(repository, self.config.timeout_s)
        listed = git(
            "ls-remote", "--", reached.url, ref, f"{ref}^{{}}",
            timeout=self.config.timeout_s, env=reached.env,
        )  # fmt: skip
        if listed.returncode != 0:
            raise GitFailed(f"ls-remote failed: {_last_line(listed.stderr)}")
        refs = {}
        for line in listed.stdout.splitlines():
            sha, _, name = line.partition("\t")
            refs[name] = sha
        # An annotated tag is listed twice; its peeled line names the commit.
        commit = refs.get(f"{ref}^{{}}") or refs.get(ref)
        if commit is None:
            return NotFound(f"{repository} has no {ref}")
        data = {"repository": repository, "commit": commit, "ref": ref}
        return Found(system=self.config.system, external_id=commit, data=data)

    def _check_repository(self, path: str) -> str:
        """The repository's git directory."""
        if not os.path.isdir(path):
            raise GitFailed("no such directory")
        checked = git(
            "rev-parse", "--absolute-git-dir",
            cwd=path, timeout=self.config.timeout_s, env=_ceiling(path),
        )  # fmt: skip
        if checked.returncode != 0:
            raise GitFailed(f"not a git repository: {_last_line(checked.stderr)}")
        return checked.stdout.strip()

    def _local(self, repository: str) -> str:
        """A local repository's checked real path: under a git root, and so is the git
        directory it names (a .git file may point elsewhere)."""
        try:
            path = local_check(repository)
            local_check(self._check_repository(path))
        except destinations.Refused as exc:
            raise GitFailed(f"refused: {exc}") from None
        return path
