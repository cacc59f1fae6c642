INSERT INTO hookledger_private.rejected_deliveries
    (received_at, endpoint, reason, detail, verified, http_status, body_sha256, body_size,
     body_prefix, headers, remote_addr)
VALUES (%(received_at)s, %(endpoint)s, %(reason)s, %(detail)s, %(verified)s, %(http_status)s,
        %(body_sha256)s, %(body_size)s, %(body_prefix)s, %(headers)s::jsonb, %(remote_addr)s)
