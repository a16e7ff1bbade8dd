"""The base of the stack, with no domain: the error tree and exit codes, cache and state folders,
API keys, the one new-file writer and the one HTTP/1.1 client."""
