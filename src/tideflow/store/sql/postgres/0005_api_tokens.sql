-- tideflow schema version 5 (PostgreSQL): API tokens and their roles (model/tokens.py).
-- Only a hash of each token's secret is kept ("sha256:<hex>"): the secret is shown once,
-- when the token is created, and is in no table. A revoked token keeps its row, with
-- revoked_at set, so that listings say when and a revoked token is told apart from an
-- unknown one. last_used_at: the last request it authenticated, to the minute
-- (api/auth.py, USE_RECORDED_EVERY).
CREATE TABLE api_tokens (
    token_id     TEXT COLLATE "C" PRIMARY KEY,
    name         TEXT NOT NULL,
    role         TEXT COLLATE "C" NOT NULL,
    secret_hash  TEXT COLLATE "C" NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    revoked_at   DOUBLE PRECISION,
    last_used_at DOUBLE PRECISION
);
