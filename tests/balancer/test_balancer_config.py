"""`kvstore balancer-config`: what it prints is a configuration the real HAProxy accepts (`haproxy -c`), keyed on the
same fields `kvstore serve` reads names from; bad arguments are one-line errors."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from haproxy import haproxy_binary

from kvstore.hooks import naming


def balancer_config(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvstore.cli", "balancer-config", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)


def haproxy_accepts(tmp_path, text: str) -> None:
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text)
    r = subprocess.run([haproxy_binary(), "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


SERVERS = ("--server", "http://127.0.0.1:8081", "--server", "10.0.0.2:8080", "--server", "http://[::1]:8083")


@pytest.mark.parametrize("extra", [(), ("--balance", "roundrobin"), ("--balance-factor", "0"), ("--name-from-user",),
                                   ("--buffer-size", "1048576", "--head-bytes", "1024", "--timeout", "1800",
                                    "--check-interval", "0.5", "--log", "--stats-socket", "/tmp/kv-lb.sock")])
def test_haproxy_accepts_what_it_prints(tmp_path, extra):
    r = balancer_config("--listen", "127.0.0.1:8080", *SERVERS, *extra)
    assert r.returncode == 0, r.stderr
    haproxy_accepts(tmp_path, r.stdout)
    assert r.stdout.count("\n    server kv") == 3


def test_keyed_on_the_fields_kvstore_serve_reads(tmp_path):
    text = balancer_config("--listen", "0.0.0.0:8080", *SERVERS).stdout
    rules = [line.strip() for line in text.splitlines() if "set-var(txn.kv_key" in line]
    # the body's name wins over the header, as in naming.naming_of: its rule comes last (a later rule overrides)
    assert rules[-1].endswith(f"req.body,json_query('$.{naming.NAME_FIELD}')"), rules
    assert rules[-2].endswith(f"req.hdr({naming.NAME_HEADER})"), rules
    assert not any(naming.USER_FIELD in r for r in rules)  # `user` names only with --name-from-user
    # OpenAI's prompt_cache_key: above every prompt head, below the names
    at = [i for i, r in enumerate(rules) if r.endswith("json_query('$.prompt_cache_key')")]
    heads = [i for i, r in enumerate(rules) if "bytes(0," in r]
    assert len(at) == 1 and max(heads) < at[0] < len(rules) - 3, rules
    with_user = balancer_config("--listen", "0.0.0.0:8080", *SERVERS, "--name-from-user").stdout
    user_rules = [line.strip() for line in with_user.splitlines() if "set-var(txn.kv_key" in line]
    # Anthropic's Messages API names its end user in metadata.user_id; a body's own `user` wins, as in the hooks
    at = [i for i, r in enumerate(user_rules)
          if r.endswith(("json_query('$.metadata.user_id')", f"json_query('$.{naming.USER_FIELD}')"))]
    assert len(at) == 2 and user_rules[at[0]].endswith("'$.metadata.user_id')") and at[1] == at[0] + 1, user_rules
    for line in ("balance hash var(txn.kv_key)", "hash-type consistent", "hash-balance-factor 170",
                 "option httpchk GET /health", "retries 1", "option redispatch 1",
                 "retry-on conn-failure empty-response 503", "option http-buffer-request"):
        assert line in text, line
    assert "Authorization" not in text  # passed through untouched: no rule names it
    rr = balancer_config("--listen", "0.0.0.0:8080", *SERVERS, "--balance", "roundrobin").stdout
    assert "balance roundrobin" in rr and "kv_key" not in rr


@pytest.mark.parametrize("args, message", [
    (("--listen", "8080", "--server", "http://a:1"), "HOST:PORT"),
    (("--listen", ":8080", "--server", "https://a:1"), "http://HOST:PORT"),
    (("--listen", ":8080", "--server", "http://a:1/v1"), "http://HOST:PORT"),
    (("--listen", ":8080", "--server", "http://a:1", "--balance-factor", "90"), "above 100"),
    (("--listen", ":8080", "--server", "http://a:1", "--buffer-size", "4096"), "16384"),
])
def test_bad_arguments_are_one_line_errors(args, message):
    r = balancer_config(*args)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
