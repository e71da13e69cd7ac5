-- One round of the sample workload (docker-compose.yml runs it every 2 s).
INSERT INTO customers (id, name, plan, city, balance, birth, updated_at, attrs, ext, bio)
SELECT g, 'Customer ' || g, (ARRAY['basic','pro','team'])[1 + g % 3], (ARRAY['Wien','Linz','Graz'])[1 + g % 3],
       g * 1.25, date '1970-01-01' + g, now(), jsonb_build_object('tier', g % 5), gen_random_uuid(), repeat('bio ' || g || ' ', 800)
FROM generate_series(1, 50) g
ON CONFLICT (id) DO NOTHING;
INSERT INTO accounts (id, owner, tier, limit_amount, opened, note)
SELECT g, 'owner ' || g, 'basic', 1000, date '2000-01-01' + g, repeat('note ' || g || ' ', 800)
FROM generate_series(1, 10) g
ON CONFLICT (id) DO NOTHING;
UPDATE customers SET plan = (ARRAY['basic','pro','team','enterprise'])[1 + floor(random() * 4)::int], updated_at = now()
 WHERE id = 1 + floor(random() * 50)::int;
UPDATE customers SET name = name || '.' WHERE id = 1 + floor(random() * 50)::int;
UPDATE accounts SET limit_amount = limit_amount * 1.1 WHERE id = 1 + floor(random() * 10)::int;
DELETE FROM customers WHERE id = 1 + floor(random() * 50)::int AND random() < 0.2;
