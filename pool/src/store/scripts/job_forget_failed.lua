-- Ends the record of a job that failed for good (a stop of it).
-- KEYS: base, 9 failures hash
-- ARGV: base, 4 job key
-- Returns 1 if the key had failed for good (record removed), else 0.
local record = redis.call('HGET', KEYS[9], ARGV[4])
if record and string.sub(record, 1, 7) == 'failed ' then
  redis.call('HDEL', KEYS[9], ARGV[4])
  return 1
end
return 0
