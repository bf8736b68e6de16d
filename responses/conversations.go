package responses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/internal/periodic"
)

// Conversations live in HASH <prefix>conv:{tag}:<id> (field obj), their
// item IDs in order in LIST <prefix>convitems:{tag}:<id>, the items
// themselves in the shared item hashes (owner = the conversation), and a
// turn's lock in <prefix>convlock:{tag}:<id>.

// convReadScript returns {0} when the conversation is missing, else {1,
// item json…} in order, refreshing the TTLs of everything it read.
// KEYS = {conv, convitems}; ARGV = {item key prefix, ttl ms}.
var convReadScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local ids = redis.call('LRANGE', KEYS[2], 0, -1)
local out = {1}
for _, id in ipairs(ids) do
  local k = ARGV[1] .. id
  local j = redis.call('HGET', k, 'j')
  if j then
    out[#out + 1] = j
    redis.call('PEXPIRE', k, ARGV[2])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return out
`)

// conversationItems reads every item of a conversation, oldest first.
func (s *store) conversationItems(ctx context.Context, tenant, id string) ([]Item, error) {
	res, err := convReadScript.Run(ctx, s.rdb, []string{s.convKey(tenant, id), s.convItemsKey(tenant, id)},
		s.itemPrefix(tenant), s.convTTL.Milliseconds()).Slice()
	if err != nil {
		return nil, fmt.Errorf("responses: read conversation %s: %w", id, err)
	}
	if code, _ := res[0].(int64); code == 0 {
		return nil, errNotFound
	}
	items := make([]Item, 0, len(res)-1)
	for _, v := range res[1:] {
		j, _ := v.(string)
		it, err := decodeItem([]byte(j))
		if err != nil {
			return nil, fmt.Errorf("responses: decode item of conversation %s: %w", id, err)
		}
		items = append(items, it)
	}
	return items, nil
}

// convAppendScript appends items to an existing conversation.
// KEYS = {conv, convitems, lock, item keys…}; ARGV = {ttl ms, lock token,
// then json per item key, then the item IDs}.
var convAppendScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 'noconv' end
if ARGV[2] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[2] then return 'locklost' end
local a = 3
for k = 4, #KEYS do
  redis.call('HSET', KEYS[k], 'j', ARGV[a], 'k', ARGV[#ARGV], 'r', ARGV[#ARGV])
  redis.call('PEXPIRE', KEYS[k], ARGV[1])
  a = a + 1
end
local ids = {}
for i = a, #ARGV - 1 do ids[#ids + 1] = ARGV[i] end
if #ids > 0 then redis.call('RPUSH', KEYS[2], unpack(ids)) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 'ok'
`)

func (s *store) appendItems(ctx context.Context, tenant, conv, lock string, items []Item) error {
	keys := []string{s.convKey(tenant, conv), s.convItemsKey(tenant, conv), s.lockKey(tenant, conv)}
	args := []any{s.convTTL.Milliseconds(), lock}
	for _, it := range items {
		j, err := chatapi.Marshal(it)
		if err != nil {
			return fmt.Errorf("responses: encode item %s: %w", it.ID, err)
		}
		keys = append(keys, s.itemKey(tenant, it.ID))
		args = append(args, j)
	}
	for _, it := range items {
		args = append(args, it.ID)
	}
	args = append(args, conv) // owner and session key of the items
	res, err := convAppendScript.Run(ctx, s.rdb, keys, args...).Text()
	switch {
	case err != nil:
		return fmt.Errorf("responses: append to conversation %s: %w", conv, err)
	case res == "noconv":
		return errNotFound
	case res == "locklost":
		return errLocked
	}
	return nil
}

func (s *store) createConversation(ctx context.Context, tenant string, c *Conversation, items []Item) error {
	obj, err := chatapi.Marshal(c)
	if err != nil {
		return fmt.Errorf("responses: encode conversation: %w", err)
	}
	if err := s.rdb.HSet(ctx, s.convKey(tenant, c.ID), "obj", obj).Err(); err != nil {
		return fmt.Errorf("responses: create conversation: %w", err)
	}
	if err := s.rdb.PExpire(ctx, s.convKey(tenant, c.ID), s.convTTL).Err(); err != nil {
		return fmt.Errorf("responses: create conversation: %w", err)
	}
	return s.appendItems(ctx, tenant, c.ID, "", items)
}

func (s *store) getConversation(ctx context.Context, tenant, id string) (*Conversation, error) {
	obj, err := s.rdb.HGet(ctx, s.convKey(tenant, id), "obj").Result()
	if errors.Is(err, redis.Nil) {
		return nil, errNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("responses: read conversation %s: %w", id, err)
	}
	c := new(Conversation)
	if err := json.Unmarshal([]byte(obj), c); err != nil {
		return nil, fmt.Errorf("responses: decode conversation %s: %w", id, err)
	}
	return c, nil
}

// setIfExistsScript replaces obj of an existing hash; 0 when it is gone.
var setIfExistsScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'obj', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

func (s *store) updateConversation(ctx context.Context, tenant string, c *Conversation) error {
	obj, err := chatapi.Marshal(c)
	if err != nil {
		return fmt.Errorf("responses: encode conversation: %w", err)
	}
	n, err := setIfExistsScript.Run(ctx, s.rdb, []string{s.convKey(tenant, c.ID)}, obj, s.convTTL.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("responses: update conversation %s: %w", c.ID, err)
	}
	if n == 0 {
		return errNotFound
	}
	return nil
}

// deleteConversation removes the conversation and its item list; as the
// spec says, the items themselves stay (until their TTL).
func (s *store) deleteConversation(ctx context.Context, tenant, id string) error {
	n, err := s.rdb.Del(ctx, s.convKey(tenant, id), s.convItemsKey(tenant, id)).Result()
	if err != nil {
		return fmt.Errorf("responses: delete conversation %s: %w", id, err)
	}
	if n == 0 {
		return errNotFound
	}
	return nil
}

// conversationItemIDs lists a conversation's item IDs, oldest first.
func (s *store) conversationItemIDs(ctx context.Context, tenant, id string) ([]string, error) {
	pipe := s.rdb.Pipeline()
	ex := pipe.Exists(ctx, s.convKey(tenant, id))
	ids := pipe.LRange(ctx, s.convItemsKey(tenant, id), 0, -1)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("responses: list conversation %s: %w", id, err)
	}
	if ex.Val() == 0 {
		return nil, errNotFound
	}
	return ids.Val(), nil
}

// removeItemScript drops one item from a conversation.
// KEYS = {convitems, item, lock}; ARGV = {item id, conversation id, lock token}.
var removeItemScript = redis.NewScript(`
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return -1 end
local n = redis.call('LREM', KEYS[1], 0, ARGV[1])
if n > 0 and redis.call('HGET', KEYS[2], 'r') == ARGV[2] then redis.call('DEL', KEYS[2]) end
return n
`)

func (s *store) removeConversationItem(ctx context.Context, tenant, conv, item, lock string) error {
	n, err := removeItemScript.Run(ctx, s.rdb, []string{s.convItemsKey(tenant, conv), s.itemKey(tenant, item), s.lockKey(tenant, conv)},
		item, conv, lock).Int()
	switch {
	case err != nil:
		return fmt.Errorf("responses: delete item %s: %w", item, err)
	case n == -1:
		return errLocked
	case n == 0:
		return errNotFound
	}
	return nil
}

// releaseScript deletes a lock only while its token is ours;
// renewScript extends it likewise.
var (
	releaseScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	renewScript   = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0`)
)

func conversationLocked(id string) error {
	return &apierror.Error{Status: http.StatusConflict, Type: apierror.TypeInvalidRequest, Code: "conversation_locked",
		Param: "conversation", Msg: fmt.Sprintf("Another response is in progress on conversation '%s'; retry when it finishes.", id)}
}

// lockConversation takes the conversation's lock for the turn, renewing it
// every LeaseTTL/3 until the returned release is called. A held lock is a
// 409 conversation_locked (SDKs retry 409) unless wait is set, when it is
// retried until ctx ends.
func (s *Service) lockConversation(ctx context.Context, t *turn, wait bool) (release func(), err error) {
	key := s.st.lockKey(t.tenant, t.p.conversation)
	token := newID("lk_")
	for {
		ok, err := s.opts.Redis.SetNX(ctx, key, token, s.opts.LeaseTTL).Result()
		if err != nil {
			return nil, apierror.Unavailable(err, "the conversation store is unavailable")
		}
		if ok {
			break
		}
		if !wait {
			return nil, conversationLocked(t.p.conversation)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(s.opts.LeaseTTL / 10):
		}
	}
	t.lock = token
	kctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		periodic.Every(kctx, s.opts.LeaseTTL/3, func() {
			if err := renewScript.Run(kctx, s.opts.Redis, []string{key}, token, s.opts.LeaseTTL.Milliseconds()).Err(); err != nil && kctx.Err() == nil {
				s.log.Warn("responses: renew conversation lock", "conversation", t.p.conversation, "err", err)
			}
		})
	}()
	return func() {
		stop()
		<-done
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := releaseScript.Run(rctx, s.opts.Redis, []string{key}, token).Err(); err != nil {
			s.log.Warn("responses: release conversation lock", "conversation", t.p.conversation, "err", err)
		}
	}, nil
}

// ---- handlers ----

func (s *Service) convError(err error, id string) error {
	switch {
	case errors.Is(err, errNotFound):
		return conversationNotFound(id)
	case errors.Is(err, errLocked):
		return conversationLocked(id)
	}
	return apierror.Unavailable(err, "the conversation store is unavailable")
}

// parseItems reads a body's items array (at most 20), resolving item
// references and assigning IDs.
func (s *Service) parseItems(ctx context.Context, tenant string, raw json.RawMessage) ([]Item, error) {
	items, err := parseInput(raw, "items")
	if err != nil {
		return nil, err
	}
	if len(items) > 20 {
		return nil, apierror.BadRequest("items", "at most 20 items may be added at once; got %d.", len(items))
	}
	t := &turn{p: &params{raw: &createRequest{}}, tenant: tenant, sessSet: true}
	if err := s.resolveInput(ctx, t, items); err != nil {
		return nil, err
	}
	return t.input, nil
}

func (s *Service) createConversation(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	var req struct {
		Metadata map[string]string `json:"metadata"`
		Items    json.RawMessage   `json:"items"`
	}
	if len(body) > 0 {
		if err := decodeObject(body, &req); err != nil {
			return err
		}
	}
	if err := validateMetadata(req.Metadata, "metadata"); err != nil {
		return err
	}
	ctx := r.Context()
	tenant := s.opts.Tenant(ctx)
	items, err := s.parseItems(ctx, tenant, req.Items)
	if err != nil {
		return err
	}
	c := &Conversation{ID: newID(prefixConversation), Object: "conversation", CreatedAt: s.opts.Now().Unix(), Metadata: req.Metadata}
	if c.Metadata == nil {
		c.Metadata = map[string]string{}
	}
	if err := s.st.createConversation(ctx, tenant, c, items); err != nil {
		return apierror.Unavailable(err, "the conversation store is unavailable")
	}
	return chatapi.WriteJSON(w, http.StatusOK, c)
}

func (s *Service) getConversation(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	c, err := s.st.getConversation(r.Context(), s.opts.Tenant(r.Context()), id)
	if err != nil {
		return s.convError(err, id)
	}
	return chatapi.WriteJSON(w, http.StatusOK, c)
}

func (s *Service) updateConversation(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	var req struct {
		Metadata *map[string]string `json:"metadata"`
	}
	if err := decodeObject(body, &req); err != nil {
		return err
	}
	if req.Metadata == nil {
		return apierror.BadRequest("metadata", "Missing required parameter: 'metadata'.")
	}
	if err := validateMetadata(*req.Metadata, "metadata"); err != nil {
		return err
	}
	id := r.PathValue("id")
	ctx := r.Context()
	tenant := s.opts.Tenant(ctx)
	c, err := s.st.getConversation(ctx, tenant, id)
	if err != nil {
		return s.convError(err, id)
	}
	c.Metadata = *req.Metadata
	if err := s.st.updateConversation(ctx, tenant, c); err != nil {
		return s.convError(err, id)
	}
	return chatapi.WriteJSON(w, http.StatusOK, c)
}

func (s *Service) deleteConversation(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := s.st.deleteConversation(r.Context(), s.opts.Tenant(r.Context()), id); err != nil {
		return s.convError(err, id)
	}
	return chatapi.WriteJSON(w, http.StatusOK, map[string]any{"id": id, "object": "conversation.deleted", "deleted": true})
}

func (s *Service) addConversationItems(w http.ResponseWriter, r *http.Request) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	var req struct {
		Items json.RawMessage `json:"items"`
	}
	if err := decodeObject(body, &req); err != nil {
		return err
	}
	if !isSet(req.Items) {
		return apierror.BadRequest("items", "Missing required parameter: 'items'.")
	}
	id := r.PathValue("id")
	ctx := r.Context()
	tenant := s.opts.Tenant(ctx)
	items, err := s.parseItems(ctx, tenant, req.Items)
	if err != nil {
		return err
	}
	t := &turn{p: &params{conversation: id}, tenant: tenant}
	release, err := s.lockConversation(ctx, t, false)
	if err != nil {
		return err
	}
	defer release()
	if err := s.st.appendItems(ctx, tenant, id, t.lock, items); err != nil {
		return s.convError(err, id)
	}
	return chatapi.WriteJSON(w, http.StatusOK, newItemList(items, false))
}

func (s *Service) listConversationItems(w http.ResponseWriter, r *http.Request) error {
	pg, err := parsePage(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	ctx := r.Context()
	tenant := s.opts.Tenant(ctx)
	ids, err := s.st.conversationItemIDs(ctx, tenant, id)
	if err != nil {
		return s.convError(err, id)
	}
	stubs := make([]Item, len(ids))
	for i, iid := range ids {
		stubs[i] = Item{ID: iid}
	}
	pageItems, more, err := pg.apply(stubs)
	if err != nil {
		return err
	}
	want := make([]string, len(pageItems))
	for i, it := range pageItems {
		want[i] = it.ID
	}
	found, err := s.st.items(ctx, tenant, want)
	if err != nil {
		return apierror.Unavailable(err, "the conversation store is unavailable")
	}
	out := make([]Item, 0, len(want))
	for _, iid := range want {
		if si, ok := found[iid]; ok {
			out = append(out, si.Item)
		}
	}
	return chatapi.WriteJSON(w, http.StatusOK, newItemList(out, more))
}

func (s *Service) getConversationItem(w http.ResponseWriter, r *http.Request) error {
	id, iid := r.PathValue("id"), r.PathValue("item")
	ctx := r.Context()
	tenant := s.opts.Tenant(ctx)
	ids, err := s.st.conversationItemIDs(ctx, tenant, id)
	if err != nil {
		return s.convError(err, id)
	}
	found := false
	for _, x := range ids {
		found = found || x == iid
	}
	var items map[string]storedItem
	if found {
		if items, err = s.st.items(ctx, tenant, []string{iid}); err != nil {
			return apierror.Unavailable(err, "the conversation store is unavailable")
		}
	}
	si, ok := items[iid]
	if !ok {
		return apierror.NotFound("", "Item with id '%s' not found in conversation '%s'.", iid, id)
	}
	return chatapi.WriteJSON(w, http.StatusOK, si.Item)
}

func (s *Service) deleteConversationItem(w http.ResponseWriter, r *http.Request) error {
	id, iid := r.PathValue("id"), r.PathValue("item")
	ctx := r.Context()
	tenant := s.opts.Tenant(ctx)
	c, err := s.st.getConversation(ctx, tenant, id)
	if err != nil {
		return s.convError(err, id)
	}
	t := &turn{p: &params{conversation: id}, tenant: tenant}
	release, err := s.lockConversation(ctx, t, false)
	if err != nil {
		return err
	}
	defer release()
	if err := s.st.removeConversationItem(ctx, tenant, id, iid, t.lock); err != nil {
		if errors.Is(err, errNotFound) {
			return apierror.NotFound("", "Item with id '%s' not found in conversation '%s'.", iid, id)
		}
		return s.convError(err, id)
	}
	return chatapi.WriteJSON(w, http.StatusOK, c)
}
