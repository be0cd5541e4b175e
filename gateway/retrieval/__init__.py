"""Retrieval: query vectors, the legs, fusion, the ACL gate, reranking, passages and objects.

``retriever.Retriever`` is the one owner of a text query's path: query vector
(``query_embedding.QueryEmbedder``) -> legs (``legs.RetrievalLegs``) -> fusion (``ranking``,
``fusion``) -> ACL gate -> records or passages (``passages``), optionally reranked (``rerank``) and
widened (``expand``). ``objects.ObjectRetriever`` does the same for images, with
``characterize`` as its pure math.
"""
