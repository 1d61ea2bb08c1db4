-- Mail to users about their jobs' findings. The transaction that queues a message also records
-- its jobs in mailed_units, so a restart or a kill never puts a job in a second message; a
-- message waits in the outbox until the SMTP server takes it (or refuses it for good).
CREATE TABLE mail_outbox (
    id INTEGER PRIMARY KEY,
    usr TEXT NOT NULL,
    -- The envelope: the sender and the one recipient ('' when the user has no valid address).
    mail_from TEXT NOT NULL,
    rcpt_to TEXT NOT NULL,
    message_id TEXT NOT NULL,
    -- The whole message as sent, so a retry sends the same bytes and the same Message-ID.
    raw BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    -- queued, sent, refused
    status TEXT NOT NULL DEFAULT 'queued',
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    sent_at INTEGER
);
CREATE INDEX mail_outbox_queued ON mail_outbox (id) WHERE status = 'queued';

-- Every ended job the notifier has looked at, with the message it went in (NULL: nothing to
-- say, the user opted out, or its findings were below the minimum severity).
CREATE TABLE mailed_units (
    unit_id INTEGER PRIMARY KEY REFERENCES units(id) ON DELETE CASCADE,
    message_id INTEGER REFERENCES mail_outbox(id) ON DELETE SET NULL
);

-- When the last digest round ran, and the oldest end a digest looks at.
CREATE TABLE notify_state (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
