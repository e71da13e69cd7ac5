-- Least privilege for scd2sink (docs/operations.md, "Least privilege").
-- Run once, as an administrator (a superuser, or the database's owner
-- holding CREATEROLE), with psql:
--
--   psql "$ADMIN_DSN" -v schema=history -v service_role=scd2sink \
--        -v service_password="$SCD2SINK_DB_PASSWORD" -v reader_role=history_reader \
--        -f deploy/least-privilege.sql
--
-- and name the same schema in scd2sink's configuration:
--
--   postgres:
--     schema: history
--
-- The service's role is no superuser, cannot create databases or roles,
-- has no CREATE on the database, and owns only what it creates in the
-- schema: its history tables with their side tables, indexes, views and
-- _as_of functions, and its own bookkeeping tables. The reporting role
-- reads the history, the views and the _as_of functions, and nothing
-- else; every object the service creates later is readable by it at once
-- (default privileges).
\set ON_ERROR_STOP on

CREATE ROLE :"service_role" LOGIN PASSWORD :'service_password'
  NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
CREATE ROLE :"reader_role" NOLOGIN;

-- The schema belongs to the administrator; the service may create in it.
CREATE SCHEMA IF NOT EXISTS :"schema";
GRANT USAGE, CREATE ON SCHEMA :"schema" TO :"service_role";
GRANT USAGE ON SCHEMA :"schema" TO :"reader_role";

-- What the service creates is readable by reporting: history tables,
-- _current and the configured views, and the _as_of functions (which
-- read the history table as the caller).
ALTER DEFAULT PRIVILEGES FOR ROLE :"service_role" IN SCHEMA :"schema"
  GRANT SELECT ON TABLES TO :"reader_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"service_role" IN SCHEMA :"schema"
  GRANT EXECUTE ON FUNCTIONS TO :"reader_role";

-- Analysts log in with their own roles and are granted the reporting role:
--   GRANT history_reader TO alice;
