-- Every mail a waste campaign sent (the SQLite twin of this migration says why).
CREATE TABLE campaign_mails (
    campaign TEXT NOT NULL,
    cluster_id TEXT NOT NULL,
    usr TEXT NOT NULL,
    test_mode BIGINT NOT NULL,
    sent_at BIGINT NOT NULL,
    figure DOUBLE PRECISION NOT NULL,
    share DOUBLE PRECISION NOT NULL,
    message_id BIGINT,
    PRIMARY KEY (campaign, cluster_id, usr, test_mode, sent_at)
);
