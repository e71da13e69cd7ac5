-- Least privilege for scd2sink (docs/operations.md, "Least privilege").
-- Run it with psql (10 or later), as a superuser or as a role with
-- CREATEROLE that may create the schema (the database's owner, say):
--
--   psql "$ADMIN_DSN" -v schema=history -v service_role=scd2sink \
--        -v service_password="$SERVICE_PASSWORD" -v reader_role=history_reader \
--        -f deploy/least-privilege.sql
--
-- $ADMIN_DSN and $SERVICE_PASSWORD are your shell's; scd2sink reads
-- neither. The password becomes the service role's; scd2sink gets it from
-- its DSN (the environment variable SCD2SINK_POSTGRES_DSN, or the file
-- named by postgres.dsn_file) or from libpq's PGPASSWORD. Name the same
-- schema in scd2sink's configuration:
--
--   postgres:
--     dsn: "postgres://scd2sink@warehouse:5432/warehouse"
--     schema: history
--
-- Running it again is safe: roles that exist are kept (the service's gets
-- the password given), and the grants are made again. It stops at the
-- first error (ON_ERROR_STOP), also when the service's role exists with
-- more than LOGIN (a superuser, CREATEDB, CREATEROLE, REPLICATION or
-- BYPASSRLS).
--
-- The default privileges below are set FOR ROLE the service's role, which
-- PostgreSQL allows only to a member of that role (from 16 on, a member
-- that inherits its privileges). A superuser needs nothing more. Any other
-- administrator is made such a member here: before 16 by a plain GRANT;
-- from 16 on WITH INHERIT TRUE, SET FALSE, since a role with CREATEROLE
-- gets only ADMIN on the roles it creates. The administrator then holds the
-- privileges of the service's role (its tables included) as its own.
--
-- The service's role is no superuser, cannot create databases or roles,
-- has no CREATE on the database, and owns only what it creates in the
-- schema: its history tables with their side tables, indexes, views and
-- _as_of functions, and its own bookkeeping tables. The reporting role
-- reads the history, the views and the _as_of functions, and nothing
-- else; every object the service creates later is readable by it at once
-- (default privileges).
\set ON_ERROR_STOP on

-- The roles, unless they exist.
SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'service_role') AS create_service,
       NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'reader_role') AS create_reader,
       coalesce((SELECT rolsuper OR rolcreatedb OR rolcreaterole OR rolreplication OR rolbypassrls
                 FROM pg_roles WHERE rolname = :'service_role'), false) AS service_too_strong,
       current_setting('server_version_num')::int >= 160000 AS pg16 \gset
\if :service_too_strong
DO $$BEGIN RAISE EXCEPTION 'the service role exists with more than LOGIN (SUPERUSER, CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS): take that away, or name another service_role'; END$$;
\endif
\if :create_service
CREATE ROLE :"service_role" LOGIN PASSWORD :'service_password'
  NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
\else
ALTER ROLE :"service_role" LOGIN PASSWORD :'service_password';
\endif
\if :create_reader
CREATE ROLE :"reader_role" NOLOGIN;
\endif

-- The administrator holds the service role's privileges, for ALTER
-- DEFAULT PRIVILEGES FOR ROLE below (a superuser always does).
\if :pg16
SELECT NOT pg_has_role(:'service_role', 'USAGE') AS grant_self \gset
\else
SELECT NOT pg_has_role(:'service_role', 'MEMBER') AS grant_self \gset
\endif
\if :grant_self
\if :pg16
GRANT :"service_role" TO CURRENT_USER WITH INHERIT TRUE, SET FALSE;
\else
GRANT :"service_role" TO CURRENT_USER;
\endif
\endif

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
-- scd2sink import reads its --from table as the service's role: grant it
-- that table, e.g.
--   GRANT USAGE ON SCHEMA analytics TO scd2sink;
--   GRANT SELECT ON analytics.customers_snapshot TO scd2sink;
