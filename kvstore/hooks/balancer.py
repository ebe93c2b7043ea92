"""`kvstore balancer-config`: an HAProxy configuration that sends each request to the server holding its state.

Contract: `render(BalancerConfig) -> str` is a complete HAProxy 2.6 configuration (`haproxy -c -f` accepts it) for
one frontend in front of several `kvstore serve` sharing one store. We write no router: HAProxy is the engine, this
module only says how it should choose.

* **Key.** A request is hashed on its state's name, read as `kvstore serve` reads it (`naming.py`, the one source
  of the field names): the body's `cache_prompt_name`, else the `X-KV-Name` header, else (with `--name-from-user`)
  the body's `user`, else its `metadata.user_id` (Anthropic's); `/kvstore/states/{name}` on its path. An unnamed
  request is hashed on the head of its prompt (`prompt`, else the first chat message, else a Responses `input`'s or
  its `instructions`, else a Messages `system` string, else the raw body's first bytes), so questions about one
  article meet where the article already is; above that, OpenAI's
  `prompt_cache_key` (its own routing hint for a prompt cache). No key at all (a GET, a token-list prompt): round
  robin.
* **Bounded load.** `hash-type consistent` (a dead server's keys move, nobody else's) with `hash-balance-factor`:
  no server takes more than that percentage of the average number of requests in flight; past it a request goes
  to the next server on the ring, so one hot key cannot fill one server while another idles.
* **Failures.** `/health` is checked (`kvstore serve` answers 503 until its llama-server is up). A request is
  retried once, on another server, only when nothing reached the client: the connection failed, the server closed
  it without answering, or it answered 503 (every 503 of `kvstore serve` means "nothing was done").
* **Pass-through.** Headers (`Authorization`, `X-KV-*`) and bodies go through untouched; replies are streamed.
  The reply gains `X-KV-Server: <server name>` (which server answered: for logs, tests and the bench).

Limits (measured, docs/hooks.md "Behind a balancer"): HAProxy looks at most `--buffer-size` bytes of a request
(minus 1 KiB of rewrite reserve and the headers). A body field past that point cannot be hashed: the header
still works, a name placed before the prompt still works, otherwise the raw head of the body is hashed; such a
request is also not retried after it was sent (only a refused connection is).
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

from kvstore.llama import HEALTH

from .naming import METADATA_FIELD, METADATA_USER_KEY, NAME_FIELD, NAME_HEADER, USER_FIELD

BALANCES = ("name", "roundrobin")
STATES_PATH = "/kvstore/states/"  # /kvstore/states/{name}: the name is the path's 4th field
KEY_VAR = "txn.kv_key"
SERVER_HEADER = "X-KV-Server"
# JSON fields whose head stands for an unnamed prompt: llama-server's /completion, the OpenAI chat API, its
# Responses API (the input as a string or its first item's text, then the instructions, which come first), and
# Anthropic's Messages API (its first message, then a `system` string, which comes first).
PROMPT_PATHS = ("$.prompt", "$.messages[0].content", "$.input", "$.input[0].content", "$.instructions", "$.system")
# The Messages API's end-user id: the name with --name-from-user, as `user` is on OpenAI's APIs.
MESSAGES_USER_PATH = f"$.{METADATA_FIELD}.{METADATA_USER_KEY}"
# OpenAI's routing hint for its prompt cache (chat and Responses APIs): requests that give the same key are meant to
# meet the same cache; above the prompt's head, below a name.
CACHE_KEY_FIELD = "prompt_cache_key"
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER = re.compile(r"[A-Za-z0-9-]+")


@dataclass(frozen=True)
class Server:
    name: str
    host: str
    port: int


@dataclass(frozen=True)
class BalancerConfig:
    listen: str  # HOST:PORT
    servers: tuple[str, ...]  # http://HOST:PORT of each kvstore serve
    balance: str = "name"  # "name": the rules above; "roundrobin": none (the baseline the bench compares)
    # hash-balance-factor, percent of the average in flight; 0: unbounded. HAProxy rounds its slot shares down
    # for one server and up for another: with two servers at 150 one of them may hold only 1 request while a second
    # one (or a stream still closing) is in flight, which moves returning users for nothing; at 170 each holds 3
    # of 3 (the bench's W1), and one of them gets a 4th only beyond 6 in flight.
    balance_factor: int = 170
    head_bytes: int = 256  # bytes of an unnamed prompt's head that are hashed
    buffer_size: int = 256 * 1024  # tune.bufsize: the most of a request HAProxy sees (16 KiB by default)
    timeout: float = 660.0  # seconds without a byte either way (above kvstore serve's --upstream-timeout, 600)
    check_interval: float = 2.0  # seconds between health checks
    name_from_user: bool = False  # as the servers' --name-from-user
    maxconn: int = 1000
    log: bool = False  # one line per request on stderr (haproxy -db)
    stats_socket: str = ""  # an admin socket: `show stat`, `set server servers/kv1 state drain`


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {value!r}: expected HOST:PORT (e.g. 0.0.0.0:8080)")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_server(url: str, index: int) -> Server:
    u = urlsplit(url if "://" in url else f"http://{url}")
    if u.scheme != "http" or not u.hostname or u.path not in ("", "/") or u.query:
        raise ValueError(f"--server {url!r}: expected http://HOST:PORT (a kvstore serve; TLS is the frontend's job)")
    try:
        port = u.port or 80
    except ValueError:
        raise ValueError(f"--server {url!r}: bad port") from None
    return Server(f"kv{index + 1}", u.hostname, port)


def _seconds(value: float) -> str:
    ms = max(1, round(value * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _key_rules(cfg: BalancerConfig) -> list[str]:
    """`http-request set-var` lines, lowest priority first: a later rule whose sample exists (and is not empty)
    overrides the key an earlier one set."""
    for f in (NAME_FIELD, USER_FIELD, CACHE_KEY_FIELD, METADATA_FIELD, METADATA_USER_KEY):
        assert _FIELD.fullmatch(f), f  # pasted into a JSON path below
    assert _HEADER.fullmatch(NAME_HEADER)
    n = cfg.head_bytes
    rules = [f"# unnamed: the head of the prompt (the raw body's head when its JSON is cut by the buffer)",
             f"http-request set-var({KEY_VAR},ifnotempty) req.body,bytes(0,{n}) if METH_POST"]
    rules += [f"http-request set-var({KEY_VAR},ifnotempty) req.body,json_query('{p}'),bytes(0,{n})"
              for p in PROMPT_PATHS]
    rules += [f"http-request set-var({KEY_VAR},ifnotempty) req.body,json_query('$.{CACHE_KEY_FIELD}')"]
    rules += ["# named: as kvstore serve reads the name (kvstore/hooks/naming.py); the body wins over the header",
              f"http-request set-var({KEY_VAR},ifnotempty) path,field(4,/),url_dec if {{ path_beg {STATES_PATH} }}"]
    if cfg.name_from_user:
        rules += [f"http-request set-var({KEY_VAR},ifnotempty) req.body,json_query('{p}')"
                  for p in (MESSAGES_USER_PATH, f"$.{USER_FIELD}")]
    rules += [f"http-request set-var({KEY_VAR},ifnotempty) req.hdr({NAME_HEADER})",
              f"http-request set-var({KEY_VAR},ifnotempty) req.body,json_query('$.{NAME_FIELD}')"]
    return rules


def render(cfg: BalancerConfig) -> str:
    if cfg.balance not in BALANCES:
        raise ValueError(f"--balance {cfg.balance!r}: one of {', '.join(BALANCES)}")
    if not cfg.servers:
        raise ValueError("at least one --server URL")
    if cfg.balance_factor and cfg.balance_factor <= 100:
        raise ValueError(f"--balance-factor {cfg.balance_factor}: a percentage above 100 (or 0: unbounded)")
    if cfg.buffer_size < 16384:
        raise ValueError(f"--buffer-size {cfg.buffer_size}: at least 16384 (HAProxy's default)")
    if cfg.head_bytes < 1:
        raise ValueError(f"--head-bytes {cfg.head_bytes}: at least 1")
    host, port = parse_listen(cfg.listen)
    servers = [parse_server(u, i) for i, u in enumerate(cfg.servers)]
    t = _seconds(cfg.timeout)
    out = ["# generated by `kvstore balancer-config` (kvstore/hooks/balancer.py); HAProxy 2.6 or newer",
           "global",
           f"    maxconn {cfg.maxconn}",
           f"    tune.bufsize {cfg.buffer_size}  # the most of a request HAProxy sees: hashing and retries need it",
           "    tune.maxrewrite 1024",
           *(["    log stderr format raw local0"] if cfg.log else []),
           *([f"    stats socket {cfg.stats_socket} mode 600 level admin"] if cfg.stats_socket else []),
           "",
           "defaults",
           "    mode http",
           *(["    log global", "    option httplog", "    option dontlognull"] if cfg.log else []),
           "    timeout connect 5s",
           "    timeout http-request 60s  # a whole request (its body is waited for: option http-buffer-request)",
           "    timeout http-keep-alive 30s",
           f"    timeout client {t}  # no byte either way this long: above kvstore serve's --upstream-timeout",
           f"    timeout server {t}  # (a non-streamed reply sends nothing until generation is done)",
           "    timeout queue 60s",
           "",
           "frontend kvstore",
           f"    bind {'[' + host + ']' if ':' in host else host}:{port}",
           "    option http-buffer-request  # the body (up to tune.bufsize) before choosing: the name may be in it"]
    if cfg.balance == "name":
        out += [f"    {r}" for r in _key_rules(cfg)]
    out += [f"    http-response set-header {SERVER_HEADER} %[srv_name]",
            "    default_backend servers",
            "",
            "backend servers"]
    if cfg.balance == "name":
        out += [f"    balance hash var({KEY_VAR})  # no key: round robin",
                "    hash-type consistent  # a server that goes away moves only its own keys"]
        if cfg.balance_factor:
            out.append(f"    hash-balance-factor {cfg.balance_factor}  # bounded load: at most this % of the "
                       "average in flight per server")
    else:
        out.append("    balance roundrobin")
    iv = _seconds(cfg.check_interval)
    out += ["    # one retry, on another server, only while nothing was sent to the client (503: kvstore serve did",
            "    # nothing; a body larger than the buffer is retried only after a refused connection)",
            "    retries 1",
            "    option redispatch 1",
            "    retry-on conn-failure empty-response 503",
            f"    option httpchk GET {HEALTH}",
            "    http-check expect status 200",
            f"    default-server check inter {iv} fastinter {_seconds(min(cfg.check_interval, 0.5))} fall 2 rise 2 "
            "observe layer4 error-limit 1 on-error fastinter"]
    out += [f"    server {s.name} {'[' + s.host + ']' if ':' in s.host else s.host}:{s.port}" for s in servers]
    return "\n".join(out) + "\n"


def add_args(sp: argparse.ArgumentParser) -> None:
    d = BalancerConfig("", ())
    sp.add_argument("--listen", required=True, metavar="HOST:PORT", help="where HAProxy listens for clients")
    sp.add_argument("--server", action="append", required=True, metavar="URL", dest="servers",
                    help="a kvstore serve, http://HOST:PORT (repeat for each; all on one store)")
    sp.add_argument("--balance", choices=BALANCES, default=d.balance,
                    help="name: by the request's name, else its prompt's head (default); roundrobin: ignore both")
    sp.add_argument("--balance-factor", type=int, default=d.balance_factor, metavar="PERCENT",
                    help=f"bounded load: no server above this %% of the average in flight (default "
                         f"{d.balance_factor}; 0: unbounded)")
    sp.add_argument("--head-bytes", type=int, default=d.head_bytes, metavar="N",
                    help=f"bytes of an unnamed prompt's head to hash (default {d.head_bytes})")
    sp.add_argument("--buffer-size", type=int, default=d.buffer_size, metavar="BYTES",
                    help=f"tune.bufsize: the most of a request HAProxy reads before choosing (default "
                         f"{d.buffer_size}); a name in the body past it is not seen")
    sp.add_argument("--timeout", type=float, default=d.timeout, metavar="SECONDS",
                    help=f"idle limit either way (default {d.timeout:g}: above kvstore serve's --upstream-timeout)")
    sp.add_argument("--check-interval", type=float, default=d.check_interval, metavar="SECONDS",
                    help=f"health checks of /health (default {d.check_interval:g})")
    sp.add_argument("--name-from-user", action="store_true", help="as the servers': the OpenAI `user` field names")
    sp.add_argument("--maxconn", type=int, default=d.maxconn, help=f"connections at once (default {d.maxconn})")
    sp.add_argument("--log", action="store_true", help="log each request on stderr (run haproxy with -db)")
    sp.add_argument("--stats-socket", default="", metavar="PATH",
                    help="an admin socket (socat: `show stat`; `set server servers/kv1 state drain` before a restart)")


def config_of(args: argparse.Namespace) -> BalancerConfig:
    return BalancerConfig(listen=args.listen, servers=tuple(args.servers), balance=args.balance,
                          balance_factor=args.balance_factor, head_bytes=args.head_bytes,
                          buffer_size=args.buffer_size, timeout=args.timeout, check_interval=args.check_interval,
                          name_from_user=args.name_from_user, maxconn=args.maxconn, log=args.log,
                          stats_socket=args.stats_socket)


def run(args: argparse.Namespace, out=None) -> int:
    (out or sys.stdout).write(render(config_of(args)))
    return 0
