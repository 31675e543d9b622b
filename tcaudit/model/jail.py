"""The audit process's view of the file system: read-only, the places where secrets and sockets live
replaced by empty folders, the audit's private folder the only place it can write.

The parent (:mod:`tcaudit.model.sandbox`) makes a :class:`Plan`: which folders stay visible (the
project, the Python environment, the model caches), which are hidden (``$HOME``, ``/home``,
``/root``, ``/run``, ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/etc/ssh``, every folder holding a Unix
socket of the host), which files are blanked (a socket in a visible folder, ``/etc/shadow``), and the
one writable folder, for each model (only its own project is visible). The audit process is started
in new user, PID, network, IPC, UTS and mount namespaces, by bubblewrap (``bwrap``,
:func:`bwrap_arguments`) where it is installed, else by ``unshare``; it keeps its capabilities inside
its user namespace and runs none of the user's code. Each model's process, forked from it, makes a
mount namespace of its own and applies its plan there (:func:`enter`: ``mount(2)`` and
``mount_setattr(2)`` through ctypes), then gives up every capability (:func:`drop_privileges`), so
that the model's code, root of its user namespace, cannot undo the mounts, before any of the
user's code runs.

Reading is still possible inside the visible folders: the project itself (its ``.env``, its
``.git``) is visible to the model's code, as it must be to build the model.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import pwd
import stat
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Iterable

# Folders replaced by empty tmpfs: where credentials, agents' sockets and other users' files live.
_HIDDEN = ("/home", "/root", "/run", "/var/run", "/tmp", "/var/tmp", "/dev/shm", "/etc/ssh", "/var/lib/docker",
           "/var/spool", "/var/mail")
# Where credentials live in a home folder: hidden even when the home folder itself is visible (a
# project that is the home folder, a script run from it).
_HOME_SECRETS = (".ssh", ".gnupg", ".aws", ".azure", ".config", ".docker", ".kube", ".netrc", ".pypirc",
                 ".git-credentials", ".cache/tcaudit", ".local/share/keyrings", ".password-store", ".bash_history",
                 ".python_history", ".zsh_history")
# Folders of /etc where hosts keep keys and credentials (the rest of /etc is the system's configuration).
_ETC_SECRETS = ("/etc/ssl/private", "/etc/pki/tls/private", "/etc/letsencrypt", "/etc/cloud", "/etc/sudoers.d",
                "/etc/NetworkManager/system-connections", "/etc/wireguard", "/etc/openvpn", "/etc/ipsec.d",
                "/etc/docker", "/etc/kubernetes", "/etc/containerd", "/etc/rancher", "/etc/gitlab-runner",
                "/etc/ceph", "/etc/krb5.keytab.d")
# Files replaced by an empty one (a folder of the system that cannot be hidden as a whole).
_BLANKED = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers", "/etc/security/opasswd",
            "/etc/ipsec.secrets", "/etc/ppp/chap-secrets", "/etc/ppp/pap-secrets", "/etc/krb5.keytab",
            "/etc/machine-id", "/var/lib/dbus/machine-id")
# The top-level folders the audit process sees: the system's programs, libraries and configuration.
# Every other one (/opt with a CI runner's .credentials, /var with cloud-init's user data, /srv, /mnt,
# /home, /root, /work...) is hidden, save the project and the Python environment inside it: an
# allowlist, not a list of places secrets are known to live.
_ROOT_KEPT = frozenset({"usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin", "etc", "dev", "proc", "sys",
                        "nix", "gnu"})
# Token files of the model caches that stay visible (a cache is needed, its login is not).
_CACHE_TOKENS = ("token", "stored_tokens", "credentials", ".netrc")
# Never hidden as a whole, whatever socket they hold: the system the audit runs on.
_SYSTEM = frozenset({"/", "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/var", "/opt", "/srv",
                     "/dev", "/proc", "/sys", "/boot", "/mnt", "/media", "/nix", "/snap"})


class JailError(Exception):
    """The file system view could not be set up (the audit process does not start without it)."""


@dataclass(frozen=True)
class Plan:
    writable: str  # the private folder: the one place the audit process can write
    visible: tuple[str, ...]  # read-only, kept even under a hidden folder
    hidden: tuple[str, ...]  # replaced by an empty tmpfs
    blanked: tuple[str, ...]  # files replaced by /dev/null

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        data = json.loads(text)
        return cls(str(data["writable"]), tuple(data["visible"]), tuple(data["hidden"]), tuple(data["blanked"]))


def _real(path: str) -> str | None:
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return None
    return real if os.path.exists(real) else None


def _under(path: str, folder: str) -> bool:
    return path == folder or folder == "/" or path.startswith(folder.rstrip("/") + "/")


def _outermost(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths, without those inside another of them, shortest first."""
    kept: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if not any(_under(path, other) for other in kept):
            kept.append(path)
    return tuple(kept)


def host_sockets() -> list[str]:
    """The paths of the Unix-domain sockets bound in this network namespace (``/proc/net/unix``)."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()[1:]
    except OSError:
        return []
    paths = []
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7].startswith("/"):
            paths.append(fields[7])
    return paths


def python_environment() -> list[str]:
    """What the audit process must see to run: the interpreter, its libraries, this tcaudit."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # ``python -m tcaudit`` puts the folder it runs in on sys.path: not shown where that is a home folder.
    places = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              package_root, *[p for p in sys.path if p and not home_or_above(p)]]
    places += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    places += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    return places


def model_caches() -> list[str]:
    """Read-only caches a model's constructor may load from (configs of Hugging Face models, torch hub)."""
    home = os.path.expanduser("~")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return [os.environ.get("HF_HOME") or os.path.join(cache, "huggingface"),
            os.environ.get("TORCH_HOME") or os.path.join(cache, "torch")]


def home_or_above(path: str) -> bool:
    """Whether ``path`` is the root, a home folder or a folder holding one (never shown whole: the
    project inside it is)."""
    real = os.path.realpath(path)
    if real == os.sep:
        return True
    homes = {os.path.realpath(h) for h in _home_folders()[:1] + [os.path.expanduser("~")] if h}
    return any(h == real or h.startswith(real.rstrip(os.sep) + os.sep) for h in homes)


def _home_folders() -> list[str]:
    folders = [os.environ.get("HOME", ""), os.environ.get("XDG_RUNTIME_DIR", ""), tempfile.gettempdir()]
    try:
        folders.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    return [f for f in folders if f]


def _top_level() -> tuple[set[str], set[str]]:
    """The folders and files at the top of the file system that the view does not keep (symlinks such
    as ``/lib -> usr/lib`` lead into kept folders and stay)."""
    folders, files = set(), set()
    try:
        entries = list(os.scandir("/"))
    except OSError:
        return folders, files
    for entry in entries:
        if entry.name in _ROOT_KEPT or entry.is_symlink():
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                folders.add(entry.path)
            elif entry.is_file(follow_symlinks=False):
                files.add(entry.path)
        except OSError:
            continue
    return folders, files


def _private_entries(folder: str, needed: tuple[str, ...], top: bool, depth: int = 4) -> tuple[list[str], list[str]]:
    """What to hide in a shown home folder: its dot-entries (``top``), or in a folder holding something
    ``needed`` (``~/.cache`` around ``~/.cache/huggingface``) every other entry, as (folders, files)."""
    folders: list[str] = []
    files: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return folders, files
    for entry in entries:
        if top and not entry.name.startswith("."):
            continue
        path = entry.path
        if any(_under(path, n) for n in needed):
            continue  # needed itself (or inside what is needed)
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            is_file = entry.is_file(follow_symlinks=False)
        except OSError:
            continue
        if any(_under(n, path) for n in needed):
            if is_dir and depth > 0:
                inner = _private_entries(path, needed, False, depth - 1)
                folders += inner[0]
                files += inner[1]
        elif is_dir:
            folders.append(path)
        elif is_file:
            files.append(path)
    return folders, files


def make_plan(writable: str, visible: Iterable[str]) -> Plan:
    """The view for an audit process writing to ``writable`` and reading ``visible`` (the projects)."""
    shown = _outermost(r for r in map(_real, [*visible, *python_environment(), *model_caches()]) if r)
    writable = os.path.realpath(writable)
    hidden = {r for r in map(_real, [*_HIDDEN, *_ETC_SECRETS, *_home_folders()]) if r and os.path.isdir(r)}
    blanked = set()
    top_dirs, top_files = _top_level()
    hidden.update(top_dirs)
    blanked.update(top_files)
    for socket_path in host_sockets():
        real = _real(socket_path)
        if real is None:
            continue
        folder = os.path.dirname(real)
        # A socket's folder is hidden as a whole, unless the model needs what is in it or around it.
        if folder in _SYSTEM or any(_under(folder, s) or _under(s, folder) for s in (*shown, writable)):
            blanked.add(real)
        else:
            hidden.add(folder)
    hidden_folders = tuple(h for h in _outermost(hidden) if h not in _SYSTEM or h in top_dirs)
    # Secrets inside a folder that stays visible (a home folder that is the project) are hidden on top.
    for home in _home_folders():
        for name in _HOME_SECRETS:
            secret = _real(os.path.join(home, name))
            if secret and any(_under(secret, s) for s in shown) and not _under(writable, secret):
                if os.path.isdir(secret):
                    hidden_folders += (secret,)
                else:
                    blanked.add(secret)
        # A home folder shown (the project is the home folder, or in it): none of its dot-entries but
        # what the Python environment and the model caches need (an allowlist: ~/.kaggle, ~/.npmrc,
        # ~/.pgpass are on no list).
        real_home = _real(home)
        if real_home and os.path.isdir(real_home) and any(_under(real_home, s) for s in shown) \
                and not _under(writable, real_home):
            wanted = [r for r in map(_real, [*python_environment(), *model_caches()]) if r]
            needed = tuple(s for s in (*shown, *wanted, writable) if s != real_home and not _under(real_home, s))
            folders, files = _private_entries(real_home, needed, top=True)
            hidden_folders += tuple(f for f in folders if f not in hidden_folders)
            blanked.update(files)
    blanked.update(r for r in map(_real, _BLANKED) if r)
    for cache in model_caches():
        tokens = (_real(os.path.join(cache, name)) for name in _CACHE_TOKENS)
        blanked.update(r for r in tokens if r and os.path.isfile(r))
    token = os.environ.get("HF_TOKEN_PATH")
    if token and _real(token) and os.path.isfile(token):
        blanked.add(_real(token))
    # A file under a hidden folder is gone, unless a visible folder brings it back.
    blanked_files = tuple(sorted(b for b in blanked if not _under(b, writable) and (
        any(_under(b, s) for s in shown) or not any(_under(b, h) for h in hidden_folders))))
    return Plan(writable, shown, hidden_folders, blanked_files)


def bwrap_arguments(workdir: str) -> list[str]:
    """bubblewrap's arguments for the audit process: the namespaces, the process's capabilities kept
    inside its user namespace (each model's process makes its own view with them, then gives them
    up), a PID namespace whose init it is, killed with its parent."""
    return ["--unshare-user", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--as-pid-1", "--cap-add", "ALL",
            "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--chdir", workdir]


# --- inside the audit process ---------------------------------------------------------------------

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 0x400, 0x800, 0x200000
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_SYS_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442, "riscv64": 442, "ppc64le": 442, "s390x": 442}
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 4, 24, 38, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    encode = (lambda s: s.encode() if s is not None else None)
    if libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)) != 0:
        error = ctypes.get_errno()
        raise JailError(f"mount {source or fstype} on {target}: {os.strerror(error)}")


def _mount_setattr(libc: ctypes.CDLL, path: str, recursive: bool, read_only: bool) -> bool:
    number = _SYS_MOUNT_SETATTR.get(os.uname().machine)
    if number is None:
        return False
    attr = _MountAttr(_MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else _MOUNT_ATTR_RDONLY, 0, 0)
    result = libc.syscall(ctypes.c_long(number), ctypes.c_int(_AT_FDCWD), path.encode(),
                          ctypes.c_uint(_AT_RECURSIVE if recursive else 0), ctypes.byref(attr),
                          ctypes.c_size_t(ctypes.sizeof(attr)))
    return result == 0


def _kept_flags(path: str) -> int:
    """The flags a bind remount must repeat (a user namespace may not drop them)."""
    flags = os.statvfs(path).f_flag
    kept = 0
    for st_flag, ms_flag in ((os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV), (os.ST_NOEXEC, _MS_NOEXEC),
                             (os.ST_NOATIME, _MS_NOATIME), (os.ST_NODIRATIME, _MS_NODIRATIME),
                             (getattr(os, "ST_RELATIME", 4096), _MS_RELATIME)):
        if flags & st_flag:
            kept |= ms_flag
    return kept


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        points = [line.split()[4].replace("\\040", " ") for line in handle if line.strip()]
    return sorted(set(points), key=len)


def _read_only_everywhere(libc: ctypes.CDLL) -> None:
    if _mount_setattr(libc, "/", True, True):
        return
    for point in _mount_points():  # kernels before 5.12: one remount per mount
        try:
            _mount(libc, None, point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _kept_flags(point))
        except (JailError, OSError):
            if point == "/":
                raise


def _make_mount_point(path: str, is_dir: bool) -> None:
    if os.path.lexists(path):
        return
    if is_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


_CLONE_NEWNS = 0x00020000
PRIVATE_FOLDER_BYTES = 512 * 1024**2  # what a model's code may write, in all, in its private folder
PRIVATE_FOLDER_ENTRIES = 20_000


def enter(plan: Plan) -> None:
    """Apply the plan to a mount namespace of this process's own, made here (the process must be
    single-threaded, a fresh fork, and hold CAP_SYS_ADMIN in its user namespace: root of one made by
    ``unshare --user --map-root-user`` or ``bwrap --unshare-user --cap-add ALL``)."""
    libc = _libc()
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise JailError(f"a mount namespace of its own: {os.strerror(ctypes.get_errno())}")
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    # Hold every folder to keep before hiding anything: a hidden folder's content is gone afterwards.
    kept = [p for p in plan.visible if any(_under(p, h) for h in plan.hidden)]
    # Hidden folders inside a visible one are hidden after it is shown again; the others before.
    inner = [h for h in plan.hidden if any(_under(h, v) and h != v for v in plan.visible)]
    outer = [h for h in plan.hidden if h not in inner]
    handles = {}
    try:
        for path in kept:
            handles[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        for folder in outer:
            _mount(libc, "tmpfs", folder, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=16m,mode=755")
        for path in kept:
            _make_mount_point(path, stat.S_ISDIR(os.fstat(handles[path]).st_mode))
            _mount(libc, f"/proc/self/fd/{handles[path]}", path, None, _MS_BIND | _MS_REC)
        for folder in inner:
            _mount(libc, "tmpfs", folder, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
        # The private folder: a tmpfs of this namespace's own, size- and entry-capped, gone with the
        # model's process (nothing it writes reaches the host's disk; the scanner reads nothing there).
        _make_mount_point(plan.writable, True)
        _mount(libc, "tmpfs", plan.writable, "tmpfs", _MS_NOSUID | _MS_NODEV,
               f"size={PRIVATE_FOLDER_BYTES},nr_inodes={PRIVATE_FOLDER_ENTRIES},mode=700")
        for name in ("HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR"):
            folder = os.environ.get(name, "")
            if folder and _under(os.path.realpath(folder), plan.writable):
                os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise JailError(f"preparing the file system view: {exc}") from exc
    finally:
        for handle in handles.values():
            os.close(handle)
    for path in plan.blanked:
        if os.path.lexists(path):
            _mount(libc, "/dev/null", path, None, _MS_BIND)
    _read_only_everywhere(libc)
    if not _mount_setattr(libc, plan.writable, False, False):
        _mount(libc, None, plan.writable, None, _MS_REMOUNT | _MS_BIND | _kept_flags(plan.writable))
    os.chdir(plan.writable)
    if not os.statvfs("/").f_flag & os.ST_RDONLY or os.statvfs(plan.writable).f_flag & os.ST_RDONLY:
        raise JailError("the file system view is not read-only with a writable private folder")


def drop_privileges() -> None:
    """Give up every capability for good (bounding set, ambient, effective, permitted, inheritable),
    allow no new ones (``no_new_privs``), and make this process untraceable by its children."""
    libc = _libc()
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for capability in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0 and ctypes.get_errno() == 22:
            break  # EINVAL: past the last capability this kernel knows
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (two words each): none
    libc.capset(header, data)
    if effective_capabilities() != 0:
        raise JailError("the audit process could not give up its capabilities")


def untraceable() -> None:
    """Neither traced nor read (``/proc/PID/mem``) by processes without capabilities: the audit
    process, whose children run the model's code."""
    _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def effective_capabilities() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def main(argv: list[str]) -> int:
    """``python -m tcaudit.model.jail probe``: apply the plan in ``TCAUDIT_JAIL`` and check it holds."""
    if argv != ["probe"] or "TCAUDIT_JAIL" not in os.environ:
        print("usage: TCAUDIT_JAIL=PLAN python -m tcaudit.model.jail probe", file=sys.stderr)
        return 2
    try:
        enter(Plan.from_json(os.environ["TCAUDIT_JAIL"]))
        drop_privileges()
    except (JailError, OSError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
