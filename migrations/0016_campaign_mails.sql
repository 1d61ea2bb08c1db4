-- Every mail a waste campaign sent a user (or, in test mode, the admins about a user): one row
-- per user, cluster and round, written in the same transaction that queues the message, so a
-- kill never mails a user twice and nobody gets the same campaign again within its gap.
CREATE TABLE campaign_mails (
    campaign TEXT NOT NULL,
    cluster_id TEXT NOT NULL,
    usr TEXT NOT NULL,
    test_mode INTEGER NOT NULL,
    sent_at INTEGER NOT NULL,
    -- The user's figure over the window and its share of the cluster's.
    figure REAL NOT NULL,
    share REAL NOT NULL,
    message_id INTEGER,
    PRIMARY KEY (campaign, cluster_id, usr, test_mode, sent_at)
);
