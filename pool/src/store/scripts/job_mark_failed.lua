-- Records that a job failed for good, where the end of its last run was
-- made to stand after the record of it went to a primary the Sentinels no
-- longer name (and was lost with its demotion). A key that runs or waits
-- for a start again is left alone: it was dispatched anew meanwhile.
-- KEYS: base, 9 failures hash
-- ARGV: base, 4 job key, 5 consecutive failures, 6 run token, 7 error text
-- Returns 1 if recorded, else 0.
local key = ARGV[4]
if mget(JOBS, key) or mget(PENDING, key) then
  return 0
end
redis.call('HSET', KEYS[9], key,
  string.format('failed %s %s %d %s', ARGV[5], ARGV[6], now_ms(), ARGV[7]))
return 1
