"""`kvstore.hooks`: the async HTTP proxy behind `kvstore serve` (docs/hooks.md).

`kvstore.hooks.app.build_app(cfg)` builds the aiohttp application; `kvstore.hooks.serve.run(args)` is
`kvstore serve`. The hooks import `kvstore`; `kvstore` never imports them (except the CLI: `serve` lazily, and
`balancer.py` for `balancer-config`).
"""
