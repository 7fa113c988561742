"""`[gateway] tls_cert` / `tls_key`: the launcher serves HTTPS itself."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from agent_gateway.cli import cli
from tests._cli import agent_gateway, clean_env, serve
from tests._harness import WAIT, sse_events


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made with the openssl command line."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    request = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"]
    names = ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    done = subprocess.run(
        [*request, *names],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return cert, key


def write_config(tmp_path: Path, cert: Path | str, key: Path | str) -> Path:
    path = tmp_path / "tls.toml"
    path.write_text(f'[gateway]\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
    return path


async def test_the_gateway_serves_https_with_the_configured_certificate(
    certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    cert, key = certificate
    config = write_config(tmp_path, cert, key)
    args = ("--demo", "--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "data"))
    async with serve(*args, env=clean_env(tmp_path), cwd=tmp_path) as gw:
        assert gw.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(cert))
        timeout = aiohttp.ClientTimeout(total=WAIT)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            async with http.get(f"{gw.url}/v1/health", ssl=trusted) as response:
                assert response.status == 200
            body = {"requestId": "r-tls", "agentId": "chat-only", "sessionId": "s-tls", "message": "hi"}
            async with http.post(f"{gw.url}/v1/runs", json=body, ssl=trusted) as response:
                assert response.status == 201, await response.text()
                run_id = (await response.json())["hostRunId"]
            async with http.get(f"{gw.url}/v1/runs/{run_id}/stream", ssl=trusted) as response:
                events = [e async for e in sse_events(response)]
            assert events[-1]["event"] == "run.completed"
            # a client that does not trust the certificate is refused by TLS, not served
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await http.get(f"{gw.url}/v1/health")
            # plain HTTP on the TLS port gets no HTTP answer
            with pytest.raises(aiohttp.ClientError):
                await http.get(gw.url.replace("https://", "http://") + "/v1/health")


def test_config_check_wants_both_files_and_existing_ones(tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    cert, _ = certificate
    only_cert = tmp_path / "a" / "tls.toml"
    only_cert.parent.mkdir()
    only_cert.write_text(f'[gateway]\ntls_cert = "{cert}"\n')
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(only_cert)])
    assert result.exit_code != 0 and "gateway.tls_cert: set tls_cert and tls_key together" in result.output

    missing = write_config(tmp_path, cert, tmp_path / "nope.pem")
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(missing)])
    assert result.exit_code != 0 and f"gateway.tls_key: file {tmp_path / 'nope.pem'} does not exist" in result.output


def test_a_key_that_does_not_load_is_one_line(certificate: tuple[Path, Path], tmp_path: Path) -> None:
    cert, _ = certificate
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a key\n")
    config = write_config(tmp_path, cert, garbage)
    proc = subprocess.run(
        [agent_gateway(), "serve", "--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(tmp_path),
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "tls_cert/tls_key: cannot load" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
