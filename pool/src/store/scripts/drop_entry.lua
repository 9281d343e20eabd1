-- Drops one entry of a worker's inbox that has nowhere to go (no other
-- worker for its key) or cannot be read (dead-lettered), during a cleanup
-- of the worker or when it leaves. A start entry's pending guard and
-- payload stay: the orphan sweep requeues the job once a worker joins.
-- KEYS: base, 9 inbox, 10 cleanup hash
-- ARGV: base, 4 entry id, 5 the cleaner's node id when a cleanup drops a
--       dead worker's entry ('' otherwise): its claim must still be its
--       own on 6 the worker id
-- Returns 'ok' | 'gone' | 'claim_lost' (the entry stays: the worker came
-- back and reads it, or another cleaner takes it on)
if not claim_held(KEYS[10], ARGV[6], ARGV[5]) then
  return 'claim_lost'
end
if redis.call('XDEL', KEYS[9], ARGV[4]) == 0 then
  return 'gone'
end
return 'ok'
