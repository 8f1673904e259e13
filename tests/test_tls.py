"""A TLS-secured cluster: bank construction and a short training run joined with certificates
(made here by openssl), and a client without them refused; the embedded LocalCluster listens on
this machine only."""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from distributed import Client, LocalCluster, Security

from fgscale._dask.client import dashboard_link, get_client
from fgscale.cli import main

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """A CA, and a certificate for 127.0.0.1 signed by it, made by cluster/tls's script."""
    folder = tmp_path_factory.mktemp("tls")
    script = Path(__file__).parents[1] / "cluster" / "tls" / "make_certificates.sh"
    subprocess.run(["bash", str(script), str(folder)], check=True, capture_output=True)
    return folder / "ca.pem", folder / "node.pem", folder / "node.key"


@pytest.fixture(scope="module")
def tls_cluster(certificates):
    ca, cert, key = certificates
    security = Security(tls_ca_file=str(ca), tls_scheduler_cert=str(cert),
                        tls_scheduler_key=str(key), tls_worker_cert=str(cert),
                        tls_worker_key=str(key), tls_client_cert=str(cert),
                        tls_client_key=str(key), require_encryption=True)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tls://",
                      host="127.0.0.1", security=security, dashboard_address=None) as cluster:
        yield cluster


def test_bank_and_training_over_tls_and_a_client_without_certificates_refused(
        certificates, tls_cluster, tiny_store, tmp_path, capsys):
    ca, cert, key = certificates
    address = tls_cluster.scheduler_address
    assert address.startswith("tls://")
    tls = ["--scheduler", address, "--tls-ca-file", str(ca), "--tls-cert", str(cert),
           "--tls-key", str(key)]
    store = str(tiny_store.path)
    assert main(["bank", store, "--n-groupings", "3", "--n-bootstrap", "8", "--n-clusters",
                 "0.1", "--seed", "1", "--no-progress", *tls]) == 0
    assert "3 groupings built" in capsys.readouterr().out
    assert main(["train", store, "--out", str(tmp_path / "run"), "--n-groupings", "3",
                 "--n-bootstrap", "8", "--n-clusters", "0.1", "--seed", "1", "--max-epochs", "2",
                 "--batch-size", "8", "--cv", "none", "--no-progress", *tls]) == 0
    assert "trained logreg/feature_grouping for 2 epochs" in capsys.readouterr().out

    # without certificates: one line, no traceback, nothing joined
    assert main(["bank", store, "--scheduler", address, "--timeout", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fgscale bank: error: {address} is a TLS scheduler: give its CA")
    assert "Traceback" not in err
    # another certificate, not signed by the cluster's CA: refused by the handshake
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(other / "k.pem"), "-out",
                    str(other / "c.pem")], check=True, capture_output=True)
    assert main(["bank", store, "--scheduler", address, "--timeout", "3", "--tls-ca-file",
                 str(other / "c.pem"), "--tls-cert", str(other / "c.pem"), "--tls-key",
                 str(other / "k.pem"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fgscale bank: error: cannot reach a Dask scheduler at {address}")
    assert "Traceback" not in err
    # half the options is refused before any connection
    assert main(["bank", store, "--scheduler", address, "--tls-cert", str(cert)]) == 2
    assert "--tls-ca-file, --tls-cert and --tls-key together" in capsys.readouterr().err


def test_a_tls_scheduler_file_joined_without_certificates_is_refused_in_one_line(
        tls_cluster, tiny_store, tmp_path, capsys):
    """The scheduler file of a TLS scheduler (cluster/tls's README starts the workers with
    one) is checked as its address is: one line, no traceback, no wait."""
    address = tls_cluster.scheduler_address
    scheduler_file = tmp_path / "sched.json"
    scheduler_file.write_text(json.dumps({"type": "Scheduler", "address": address}))
    start = time.monotonic()
    assert main(["bank", str(tiny_store.path), "--scheduler-file", str(scheduler_file),
                 "--timeout", "3", "--no-progress"]) == 2
    assert time.monotonic() - start < 3
    err = capsys.readouterr().err
    assert err.startswith(f"fgscale bank: error: {address} (from {scheduler_file}) is a TLS "
                          "scheduler: give its CA")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_plain_client_cannot_join_the_tls_scheduler(tls_cluster):
    with pytest.raises((OSError, TypeError, ValueError)):
        Client(tls_cluster.scheduler_address, timeout=3, set_as_default=False)


def _listening_addresses() -> set:
    """The addresses that this process and its children (worker processes, nannies) listen
    on, from the system's own table of sockets."""
    import psutil

    me = psutil.Process()
    return {c.laddr.ip for p in (me, *me.children(recursive=True))
            for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


@pytest.mark.parametrize("processes", [False, True])
def test_the_embedded_cluster_listens_on_this_machine_only(processes):
    before = _listening_addresses()
    with get_client(n_workers=1, processes=processes) as client:
        link = dashboard_link(client)
        assert link is None or link.startswith("http://127.0.0.1:")
        if processes:
            assert client.scheduler.address.startswith("tcp://127.0.0.1:")
        # every socket, the workers' own HTTP servers too (thread workers' listened on
        # 0.0.0.0 and ::, reachable from the node's networks)
        assert _listening_addresses() - before <= {"127.0.0.1", "::1"}
