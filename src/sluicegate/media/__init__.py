"""Images in requests: where the gateway may fetch them from (`policy`), fetching them
(`fetch`), inline base64 (`data_uri`), what an image's first bytes say it is (`formats`),
reading its pixels (`decode`), and a request's images read together (`loader`).

Below the inference service and above nothing of HTTP: the routes hand it a request's image
parts, and the run carries what it gives back (bytes, digest, pixels). No engine ever fetches
a URL a client chose: the in-process engine gets pixels, upstreams get the bytes inline.
"""
