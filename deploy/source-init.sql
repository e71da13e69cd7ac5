-- The sample source schema, shared by docker-compose.yml and the end-to-end
-- suite (e2e/, which adds an audit trigger as its ground truth).
CREATE TABLE customers (
	id integer PRIMARY KEY, name text, plan text NOT NULL, city text, balance numeric(10,2),
	birth date, updated_at timestamptz, attrs jsonb, ext uuid, bio text);
-- bio is TOASTed out of line: updates that leave it alone send Debezium's
-- unavailable-value placeholder (default replica identity).
ALTER TABLE customers ALTER COLUMN bio SET STORAGE EXTERNAL;
-- REPLICA IDENTITY FULL: updates and deletes carry the whole old row.
CREATE TABLE accounts (
	id integer PRIMARY KEY, owner text NOT NULL, tier text, limit_amount numeric(12,3), opened date, note text);
ALTER TABLE accounts REPLICA IDENTITY FULL;
ALTER TABLE accounts ALTER COLUMN note SET STORAGE EXTERNAL;
