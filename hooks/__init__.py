"""The async HTTP layer between clients and llama-server (docs/hooks.md).

`hooks.app.build_app(...)` builds the aiohttp application; `hooks.serve.main(argv)` is `kvstore serve`.
"""
