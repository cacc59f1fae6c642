INSERT INTO hookledger_private.chat_secrets
    (phone_number_id, secret, label, source, created_at)
VALUES (%(phone_number_id)s, %(secret)s, %(label)s, %(source)s, %(now)s)
