-- Thumbnails Mnemo makes for record images when the archive gives no thumb_url.
-- One per stored image (section, record, image component, image index), shared by
-- every image model's rows of that image; served by the gateway behind the same
-- ACL as the record. `content_hash` ties a thumbnail to the bytes it was made from.
CREATE TABLE IF NOT EXISTS rag_thumbnails (
    section_tipo   text NOT NULL,
    section_id     bigint NOT NULL,
    component_tipo text NOT NULL,
    image_index    integer NOT NULL,
    content_hash   text NOT NULL,
    mime           text NOT NULL DEFAULT 'image/jpeg',
    data           bytea NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (section_tipo, section_id, component_tipo, image_index)
);
