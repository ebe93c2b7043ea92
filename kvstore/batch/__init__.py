"""`kvstore batch`: an OpenAI Batch file (JSONL) through `kvstore serve`, every shared prompt prefix evaluated once.

Rooms: `requests` (the input format, read as a stream), `plan` (which prefixes are shared, the send order),
`output` (the resumable output file), `runner` (the HTTP side: tokenize, prime, send), `command` (the CLI verb,
with an embedded `kvstore serve` when no `--server` is given).
"""
