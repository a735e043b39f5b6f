-- tideflow schema version 5 (SQLite): API tokens and their roles (model/tokens.py).
-- Only a hash of each token's secret is kept ("sha256:<hex>"): the secret is shown once,
-- when the token is created, and is in no table. A revoked token keeps its row, with
-- revoked_at set, so that listings say when and a revoked token is told apart from an
-- unknown one. last_used_at: the last request it authenticated, to the minute
-- (api/auth.py, USE_RECORDED_EVERY).
CREATE TABLE api_tokens (
    token_id     TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    role         TEXT NOT NULL,
    secret_hash  TEXT NOT NULL,
    created_at   REAL NOT NULL,
    revoked_at   REAL,
    last_used_at REAL
);
